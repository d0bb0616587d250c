//! The binary port's sockets: plain TCP, or TLS (`--tls-port` on the
//! serving side, `--replica-tls-ca` on a follower's), and how one moves
//! from thread to thread inside its TLS session.
//!
//! A connection is accepted on the main runtime and served on a shard
//! thread, and its HELLO may bind it to another shard: the socket leaves
//! one runtime for another ([`Stream::park`], [`Moving::attach`]). A TLS
//! session cannot be rebuilt around a socket, so the TLS stream wraps a
//! [`Socket`] that can be parked in place: deregistered from its runtime
//! while the session state travels with it, and registered again on the
//! thread that adopts it.

use std::io;
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TLS session a node serves (the `--tls-port` side).
pub type TlsServer = tokio_rustls::server::TlsStream<Socket>;
/// A TLS session a node opened (a follower to its primary).
pub type TlsClient = tokio_rustls::client::TlsStream<TcpStream>;

/// A TCP socket registered with this thread's runtime, or parked between
/// threads (registered with none: reads and writes fail until attached).
#[derive(Debug)]
pub struct Socket(State);

#[derive(Debug)]
enum State {
    /// Registered with the current runtime.
    Live(TcpStream),
    /// Registered with no runtime, on its way to another thread.
    Parked(StdTcpStream),
    /// Only while changing state, or after a failure to.
    Gone,
}

impl Socket {
    /// A freshly accepted socket, registered with the current runtime.
    pub fn new(stream: TcpStream) -> Socket {
        Socket(State::Live(stream))
    }

    fn live(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        match &mut self.0 {
            State::Live(s) => Ok(Pin::new(s)),
            State::Parked(_) | State::Gone => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    fn park(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, State::Gone) {
            State::Live(s) => State::Parked(s.into_std()?),
            other => other,
        };
        Ok(())
    }

    fn attach(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, State::Gone) {
            State::Parked(s) => State::Live(TcpStream::from_std(s)?),
            other => other,
        };
        Ok(())
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.0 {
            State::Live(s) => s.peer_addr(),
            State::Parked(s) => s.peer_addr(),
            State::Gone => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().live() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().live() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// A binary-port connection as a shard serves it, or a follower's link to
/// its primary.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP (`--port`).
    Plain(TcpStream),
    /// TLS that this node serves (`--tls-port`).
    Tls(Box<TlsServer>),
    /// TLS that this node opened (a follower with `--replica-tls-ca`).
    TlsClient(Box<TlsClient>),
}

/// A served connection between threads: registered with no runtime.
#[derive(Debug)]
pub enum Moving {
    /// Plain TCP.
    Plain(StdTcpStream),
    /// A TLS session, its socket parked.
    Tls(Box<TlsServer>),
}

impl Moving {
    /// Registers the socket with the current runtime.
    pub fn attach(self) -> io::Result<Stream> {
        match self {
            Moving::Plain(s) => Ok(Stream::Plain(TcpStream::from_std(s)?)),
            Moving::Tls(mut s) => {
                s.get_mut().0.attach()?;
                Ok(Stream::Tls(s))
            }
        }
    }

    /// The client's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Moving::Plain(s) => s.peer_addr(),
            Moving::Tls(s) => s.get_ref().0.peer_addr(),
        }
    }
}

impl Stream {
    /// Deregisters the socket from this thread's runtime, to be attached
    /// on another's. A session this node opened never moves.
    pub fn park(self) -> io::Result<Moving> {
        match self {
            Stream::Plain(s) => Ok(Moving::Plain(s.into_std()?)),
            Stream::Tls(mut s) => {
                s.get_mut().0.park()?;
                Ok(Moving::Tls(s))
            }
            Stream::TlsClient(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS session this node opened stays on its thread",
            )),
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Stream::Plain(s) => s.peer_addr(),
            Stream::Tls(s) => s.get_ref().0.peer_addr(),
            Stream::TlsClient(s) => s.get_ref().0.peer_addr(),
        }
    }

    /// Writes what the socket takes now without waiting. A TLS stream
    /// says `WouldBlock` (its records are written by the async path, which
    /// also flushes them).
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.try_write(buf),
            Stream::Tls(_) | Stream::TlsClient(_) => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::TlsClient(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Reads a PEM file for `flag`, with the flag and path in the error.
fn read_pem(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("--{flag} {}: {e}", path.display()))
}

/// A TLS server's certificate and key, loaded (`--tls-port`'s, the rate
/// limit port's).
#[derive(Clone)]
pub struct Acceptor(tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acceptor")
    }
}

impl Acceptor {
    /// An acceptor of `config`.
    pub fn new(config: rustls::ServerConfig) -> Acceptor {
        Acceptor(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// The TLS handshake over `io` (a stream of another port's own kind).
    pub async fn accept_io<IO>(&self, io: IO) -> io::Result<tokio_rustls::server::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        self.0.accept(io).await
    }

    /// The TLS handshake on a freshly accepted socket.
    pub async fn accept(&self, stream: TcpStream) -> io::Result<Stream> {
        let session = self.0.accept(Socket::new(stream)).await?;
        Ok(Stream::Tls(Box::new(session)))
    }
}

/// A follower's side (`--replica-tls-ca`, `--replica-tls-name`).
pub struct ReplicaTls {
    connector: tokio_rustls::TlsConnector,
    name: Option<String>,
    port: Option<u16>,
}

impl std::fmt::Debug for ReplicaTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaTls")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

/// The server side of `--tls-port`: `--tls-cert` (a PEM chain) and
/// `--tls-key` (PKCS#8, PKCS#1 or SEC1), read and checked at start.
pub fn acceptor(cert: &Path, key: &Path) -> Result<Acceptor, String> {
    Ok(Acceptor::new(server_config(
        ["tls-cert", "tls-key"],
        cert,
        key,
    )?))
}

/// A TLS server's configuration from the certificate chain and key of
/// `flags` (their names, for the errors), read and checked.
pub fn server_config(
    flags: [&str; 2],
    cert: &Path,
    key: &Path,
) -> Result<rustls::ServerConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let [cert_flag, key_flag] = flags;
    let chain = CertificateDer::pem_slice_iter(&read_pem(cert_flag, cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--{cert_flag} {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--{cert_flag} {}: no certificate in it",
            cert.display()
        ));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read_pem(key_flag, key)?)
        .map_err(|e| format!("--{key_flag} {}: {e}", key.display()))?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            format!(
                "--{cert_flag} {} / --{key_flag} {}: {e}",
                cert.display(),
                key.display()
            )
        })
}

/// The client side of a follower's TLS (`--replica-tls-ca`): the
/// certificates it trusts, read and checked at start, the name to check
/// the primary's certificate against (default: the address's host), and
/// the port to dial at the followed address's host (`--replica-tls-port`;
/// default: the address's own port).
pub fn connector(ca: &Path, name: Option<String>, port: Option<u16>) -> Result<ReplicaTls, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&read_pem("replica-tls-ca", ca)?) {
        let cert = cert.map_err(|e| format!("--replica-tls-ca {}: {e}", ca.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("--replica-tls-ca {}: {e}", ca.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "--replica-tls-ca {}: no certificate in it",
            ca.display()
        ));
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if let Some(n) = &name {
        server_name("", Some(n)).map_err(|e| format!("--replica-tls-name {e}"))?;
    }
    Ok(ReplicaTls {
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        name,
        port,
    })
}

/// ring, as the rate limit port's TLS (tonic's `tls-ring`): rustls deprecates
/// it for lacking post-quantum key exchange, and aws-lc-rs, which has it,
/// needs cmake and a long C build on every machine that builds sluiced.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The name a follower checks its primary's certificate against: `name`
/// if given (`--replica-tls-name`), else the host of `addr` (an IP
/// address or a DNS name).
pub fn server_name(
    addr: &str,
    name: Option<&str>,
) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match name {
        Some(n) => n,
        None => match addr.parse::<SocketAddr>() {
            Ok(a) => return Ok(rustls::pki_types::ServerName::IpAddress(a.ip().into())),
            Err(_) => addr.rsplit_once(':').map_or(addr, |(h, _)| h),
        },
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| format!("{host}: not a name a certificate can carry: {e}"))
}

/// Opens a follower's connection to `addr`: TLS when `tls` is given.
/// With `--replica-tls-port`, the address's host at that port.
pub async fn connect(addr: &str, tls: Option<&ReplicaTls>) -> io::Result<Stream> {
    let Some(tls) = tls else {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        return Ok(Stream::Plain(tcp));
    };
    let dialed = match tls.port {
        Some(port) => with_port(addr, port),
        None => addr.to_owned(),
    };
    let addr = dialed.as_str();
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = server_name(addr, tls.name.as_deref())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tls = tls.connector.connect(name, tcp).await?;
    Ok(Stream::TlsClient(Box::new(tls)))
}

/// `addr` (HOST:PORT, `[v6]:PORT`) with its port replaced.
fn with_port(addr: &str, port: u16) -> String {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_checked_against_the_address_host_or_the_given_name() {
        use rustls::pki_types::ServerName;
        assert_eq!(
            server_name("127.0.0.1:7701", None).unwrap(),
            ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
        );
        assert_eq!(
            server_name("db-a.internal:7701", None).unwrap(),
            ServerName::try_from("db-a.internal").unwrap()
        );
        assert_eq!(
            server_name("127.0.0.1:7701", Some("db-a.internal")).unwrap(),
            ServerName::try_from("db-a.internal").unwrap()
        );
        assert!(server_name("bad name:1", None).is_err());
    }

    #[test]
    fn the_tls_port_replaces_the_followed_address_port() {
        assert_eq!(with_port("10.0.0.5:7700", 7711), "10.0.0.5:7711");
        assert_eq!(with_port("db-a.internal:7700", 7711), "db-a.internal:7711");
        assert_eq!(with_port("[::1]:7700", 7711), "[::1]:7711");
    }
}
