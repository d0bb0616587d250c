//! TLS for tests: a CA and a node certificate made as an operator makes
//! them (scripts/tls-certs.sh), and a proxy that records what crosses a
//! link, to check that it is TLS and nothing else.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

/// A CA and a node certificate for localhost and 127.0.0.1 signed by it
/// (scripts/tls-certs.sh, as an operator makes them), in a fresh
/// directory; the CA's, the certificate's and the key's paths.
pub fn ca_signed(name: &str) -> [String; 3] {
    let dir = std::env::temp_dir().join(format!("sluice-tls-{name}-{}", std::process::id()));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/tls-certs.sh"))
        .arg(&dir)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ["ca.pem", "cert.pem", "key.pem"].map(|f| dir.join(f).display().to_string())
}

/// A TCP proxy to `upstream` that keeps every byte `upstream` sends back
/// (what an eavesdropper on the link would read); its address.
pub async fn recording_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                continue;
            };
            let kept = kept.clone();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 << 10];
                while let Ok(n @ 1..) = sr.read(&mut buf).await {
                    kept.lock().unwrap().extend_from_slice(&buf[..n]);
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// Whether `bytes` are TLS records and nothing else (content type 20-23,
/// TLS 1.x, a length a record may have): what is left readable on the wire.
pub fn all_tls_records(mut bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return false;
    }
    while !bytes.is_empty() {
        if bytes.len() < 5 || !(20..=23).contains(&bytes[0]) || bytes[1] != 3 {
            return false;
        }
        let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
        if len > (16 << 10) + 2048 || bytes.len() < 5 + len {
            // A record cut at the end of the recording is still one.
            return len <= (16 << 10) + 2048;
        }
        bytes = &bytes[5 + len..];
    }
    true
}
