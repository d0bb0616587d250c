//! A raw protocol v1 connection for tests that need control of every byte:
//! several requests in one frame, frames written back to back before any
//! reply is read, malformed input.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use sluice_protocol::codec::{FrameDecoder, FrameWriter};
use sluice_protocol::message::{Reply, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

/// How long a test waits for a reply before failing.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A raw connection.
#[derive(Debug)]
pub struct Raw {
    /// The socket.
    pub stream: TcpStream,
    /// Bytes read and not yet decoded.
    rbuf: BytesMut,
    /// Decodes reply frames.
    decoder: FrameDecoder,
    /// Replies decoded and not yet handed out.
    pending: std::collections::VecDeque<(u32, Reply)>,
}

impl Raw {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Raw {
            stream,
            rbuf: BytesMut::new(),
            decoder: FrameDecoder::default(),
            pending: Default::default(),
        }
    }

    /// Writes `bytes` as they are.
    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Writes one frame holding `requests`, with ids `(id, request)`.
    pub async fn send_frame(&mut self, requests: &[(u32, Request<'_>)]) {
        let bytes = frame(requests);
        self.send_bytes(&bytes).await;
    }

    /// Reads the next reply as `(request_id, reply)`; `None` at end of stream.
    pub async fn next_reply(&mut self) -> Option<(u32, Reply)> {
        tokio::time::timeout(REPLY_TIMEOUT, self.next_reply_inner())
            .await
            .expect("a reply in time")
    }

    /// Reads `n` replies.
    pub async fn replies(&mut self, n: usize) -> Vec<(u32, Reply)> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.next_reply().await.expect("connection open"));
        }
        out
    }

    /// Whether the server closed the connection (reads end of stream,
    /// ignoring nothing: any further reply is a failure).
    pub async fn closed_by_server(&mut self) -> bool {
        matches!(
            tokio::time::timeout(REPLY_TIMEOUT, self.next_reply_inner()).await,
            Ok(None)
        )
    }

    async fn next_reply_inner(&mut self) -> Option<(u32, Reply)> {
        loop {
            if let Some(r) = self.pending.pop_front() {
                return Some(r);
            }
            if let Some(frame) = self
                .decoder
                .decode(&mut self.rbuf)
                .expect("well-formed replies")
            {
                for (h, p) in frame.messages() {
                    let reply = Reply::parse(h, p).expect("a valid reply");
                    self.pending.push_back((h.request_id, reply));
                }
                continue;
            }
            match self.stream.read_buf(&mut self.rbuf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

/// A HELLO of version 1 with `token`, binding no shard.
pub fn hello(token: &[u8]) -> Request<'_> {
    Request::Hello(sluice_protocol::message::Hello {
        version_min: 1,
        version_max: 1,
        shard: None,
        token,
        epoch: 0,
        layout: 0,
    })
}

/// Encodes one frame holding `requests`.
pub fn frame(requests: &[(u32, Request<'_>)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let mut w = FrameWriter::new();
    for (id, r) in requests {
        r.encode(&mut w, &mut buf, *id);
    }
    w.finish(&mut buf);
    buf.to_vec()
}
