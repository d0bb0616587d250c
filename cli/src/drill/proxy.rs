//! A TCP proxy on loopback that a drill (or a test) can sever: a cut link
//! between two nodes, or between clients and a node.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards every connection to its target until severed.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Where connections go; none yet: they are closed at once.
    target: Arc<Mutex<Option<SocketAddr>>>,
    /// True while severed: open connections drop at once, new ones are
    /// closed on arrival.
    severed: Arc<watch::Sender<bool>>,
}

impl Proxy {
    /// Starts a proxy to `target` on a free loopback port.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let proxy = Proxy::unbound().await?;
        proxy.set_target(target);
        Ok(proxy)
    }

    /// Starts a proxy whose target is named later ([`Proxy::set_target`]):
    /// a node's address can then name the proxy before the node runs.
    pub async fn unbound() -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = Arc::new(Mutex::new(None));
        let severed = Arc::new(watch::Sender::new(false));
        let (to, cut) = (target.clone(), severed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                let dest = *to.lock().expect("not poisoned");
                let Some(dest) = dest.filter(|_| !*cut.borrow()) else {
                    continue;
                };
                let watch = cut.subscribe();
                tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(dest).await {
                        pipe(inbound, outbound, watch).await;
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            target,
            severed,
        })
    }

    /// Where new connections go from now on.
    pub fn set_target(&self, target: SocketAddr) {
        *self.target.lock().expect("not poisoned") = Some(target);
    }

    /// Cuts the link: open connections drop, new ones are refused.
    pub fn sever(&self) {
        self.severed.send_replace(true);
    }

    /// Mends the link: new connections go through again.
    pub fn mend(&self) {
        self.severed.send_replace(false);
    }
}

/// Copies both ways until either side closes or the link is severed.
async fn pipe(a: TcpStream, b: TcpStream, mut cut: watch::Receiver<bool>) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let (mut ar, mut aw) = a.into_split();
    let (mut br, mut bw) = b.into_split();
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
        _ = cut.wait_for(|&severed| severed) => {}
    }
}
