#!/usr/bin/env python3
"""Module import cycles of a crate's src (crate::, use crate::{..}, super::), by
Tarjan's strongly connected components; test modules (`#[cfg(test)] mod tests`)
are left out. Usage: python3 scripts/module-cycles.py server/src [MODULE...]
prints each cycle, then the imports of each MODULE named; exits 1 when
there is a cycle (.ci/run checks server/src and protocol/src). docs/ARCHITECTURE.md
gives the layering it checks."""
import re,os,sys,collections
root=sys.argv[1]
files={}
for dp,dn,fn in os.walk(root):
    for f in fn:
        if f.endswith('.rs'):
            p=os.path.join(dp,f); rel=os.path.relpath(p,root)
            mod=rel[:-3].replace('/mod','').replace('/','::')
            files[mod]=open(p).read()
mods=set(files)
def resolve(path):
    parts=path.split('::')
    for i in range(len(parts),0,-1):
        m='::'.join(parts[:i])
        if m in mods: return m
    return None
edges=collections.defaultdict(set)
for m,src in files.items():
    # strip tests module
    i=src.find('#[cfg(test)]\nmod tests')
    if i>=0: src=src[:i]
    for u in re.findall(r'crate::([A-Za-z_][\w:]*)',src):
        t=resolve(u.rstrip(':'))
        if t and t!=m: edges[m].add(t)
    for u in re.findall(r'use crate::\{([^;]*)\};',src,re.S):
        for part in re.findall(r'([A-Za-z_][\w:]*)',u):
            t=resolve(part)
            if t and t!=m: edges[m].add(t)
    # super:: references
    base=m.split('::')
    for u in re.findall(r'super::([A-Za-z_][\w:]*)',src):
        parent='::'.join(base[:-1]) if not files[m] is None else ''
        # for mod.rs files, super is parent of the module
        t=resolve((('::'.join(base[:-1])+'::') if len(base)>1 else '')+u)
        if t and t!=m: edges[m].add(t)
# tarjan
index={};low={};st=[];on=set();res=[];c=[0]
def sc(v):
    index[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges[v]:
        if w not in index: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        res.append(comp)
sys.setrecursionlimit(10000)
for v in sorted(mods):
    if v not in index: sc(v)
cycles=[sorted(comp) for comp in res if len(comp)>1]
for comp in cycles: print('cycle:',comp)
if len(sys.argv)>2:
    for t in sys.argv[2:]:
        print(t,'->',sorted(edges[t]))
sys.exit(1 if cycles else 0)
