//! Just enough RESP2 to read Redis's replies in the load generator:
//! simple strings, errors, integers, bulk strings and arrays.

/// A RESP2 value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

/// Deepest array nesting accepted.
const DEPTH_MAX: usize = 8;

/// Parses one value from the front of `buf`: `Ok(Some((value, bytes
/// used)))`, `Ok(None)` if more bytes are needed, `Err` if it is not RESP.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, String> {
    parse_at(buf, 0, 0)
}

fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn int(s: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad integer {s:?}"))
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, String> {
    if depth > DEPTH_MAX {
        return Err("arrays nested too deep".into());
    }
    let Some(&tag) = buf.get(at) else {
        return Ok(None);
    };
    let Some((body, next)) = line(buf, at + 1) else {
        return Ok(None);
    };
    let text = || String::from_utf8_lossy(body).into_owned();
    match tag {
        b'+' => Ok(Some((Value::Simple(text()), next))),
        b'-' => Ok(Some((Value::Error(text()), next))),
        b':' => Ok(Some((Value::Int(int(body)?), next))),
        b'$' => {
            let len = int(body)?;
            if len < 0 {
                return Ok(Some((Value::Bulk(None), next)));
            }
            let end = next + len as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            Ok(Some((Value::Bulk(Some(buf[next..end].to_vec())), end + 2)))
        }
        b'*' => {
            let len = int(body)?;
            if len < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let mut items = Vec::with_capacity((len as usize).min(1024));
            let mut pos = next;
            for _ in 0..len {
                match parse_at(buf, pos, depth + 1)? {
                    Some((v, p)) => {
                        items.push(v);
                        pos = p;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Value::Array(Some(items)), pos)))
        }
        other => Err(format!("unknown RESP type byte {other:#04x}")),
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_type_and_waits_for_more() {
        let all = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+OK\r\n-ERR no\r\n";
        let (v, used) = parse(all).unwrap().unwrap();
        assert_eq!(used, all.len());
        assert_eq!(
            v,
            Value::Array(Some(vec![
                Value::Int(1),
                Value::Bulk(Some(b"abc".to_vec())),
                Value::Array(Some(vec![
                    Value::Simple("OK".into()),
                    Value::Error("ERR no".into())
                ])),
            ]))
        );
        for cut in 0..all.len() {
            assert_eq!(parse(&all[..cut]).unwrap(), None, "cut {cut}");
        }
        assert!(parse(b"!x\r\n").is_err());
        assert!(parse(b":x\r\n").is_err());
    }
}
