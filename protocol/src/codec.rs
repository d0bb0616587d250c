//! Frames and message headers (PROTOCOL.md, "Framing").
//!
//! A frame is a `u32` little-endian length followed by that many bytes of
//! body; the body is one or more messages laid end to end, each an 8-byte
//! header (op, flags, payload length, request id) and its payload. The
//! decoder checks the declared length against the limit *before* reserving
//! any memory, and checks that the messages tile the body exactly, so a
//! frame it returns can be walked without further bounds errors.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::Decoder;

use crate::status::Status;

/// Bytes of the frame length prefix.
pub const FRAME_PREFIX_BYTES: usize = 4;
/// Bytes of a message header.
pub const HEADER_BYTES: usize = 8;
/// Default largest frame body a peer accepts: 1 MiB.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 1 << 20;
/// The largest frame body any configuration may accept: 16 MiB.
pub const FRAME_BYTES_MAX_LIMIT: u32 = 16 << 20;
/// Frames the writer starts a new frame after, so that replies to a large
/// batch never exceed a peer's default frame limit.
pub const WRITER_FRAME_BYTES_SOFT: usize = 64 << 10;

const _: () = assert!(FRAME_BYTES_MAX_DEFAULT <= FRAME_BYTES_MAX_LIMIT);
const _: () = assert!(
    WRITER_FRAME_BYTES_SOFT + HEADER_BYTES + u16::MAX as usize <= FRAME_BYTES_MAX_DEFAULT as usize
);

/// Why a byte stream is not a valid sequence of frames. Every variant means
/// the stream can no longer be trusted: the connection must close.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame declares {len} bytes, more than the limit of {max}")]
    FrameTooLarge { len: u32, max: u32 },
    #[error("frame declares {len} bytes, fewer than one message header")]
    FrameTooShort { len: u32 },
    #[error("message at body offset {offset} has a truncated header")]
    HeaderTruncated { offset: usize },
    #[error("message at body offset {offset} declares a payload past the frame's end")]
    PayloadOverrun { offset: usize },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl DecodeError {
    /// The status to send (with request id 0) before closing.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::FrameTooLarge { .. } => Status::FrameTooLarge,
            _ => Status::Malformed,
        }
    }
}

/// A frame's body whose messages are known to tile it exactly.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The body bytes (without the length prefix).
    body: Bytes,
    /// How many messages the body holds.
    messages: usize,
}

impl Frame {
    /// How many messages the frame holds (at least one).
    pub fn len(&self) -> usize {
        self.messages
    }

    /// Always false: a decoded frame holds at least one message.
    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// The messages, in order.
    pub fn messages(&self) -> Messages<'_> {
        Messages { rest: &self.body }
    }
}

/// The fixed header of every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageHeader {
    /// What the message is (PROTOCOL.md, "Ops").
    pub op: u8,
    /// Reserved; 0 in version 1.
    pub flags: u8,
    /// Chosen by the requester, echoed in the reply.
    pub request_id: u32,
}

/// Iterator over a validated frame's messages: `(header, payload)`.
#[derive(Debug)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = (MessageHeader, &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let h = &self.rest[..HEADER_BYTES];
        let header = MessageHeader {
            op: h[0],
            flags: h[1],
            request_id: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
        };
        let payload_len = usize::from(u16::from_le_bytes([h[2], h[3]]));
        let payload = &self.rest[HEADER_BYTES..HEADER_BYTES + payload_len];
        self.rest = &self.rest[HEADER_BYTES + payload_len..];
        Some((header, payload))
    }
}

/// Splits a byte stream into [`Frame`]s.
#[derive(Clone, Copy, Debug)]
pub struct FrameDecoder {
    /// Largest body accepted; a larger declared length is an error before
    /// any byte of it is buffered.
    frame_bytes_max: u32,
}

impl FrameDecoder {
    /// A decoder that accepts bodies of up to `frame_bytes_max` bytes.
    pub fn new(frame_bytes_max: u32) -> FrameDecoder {
        assert!(
            frame_bytes_max as usize >= HEADER_BYTES && frame_bytes_max <= FRAME_BYTES_MAX_LIMIT
        );
        FrameDecoder { frame_bytes_max }
    }

    /// From the next frame on, accepts bodies of up to `frame_bytes_max`
    /// (a server raises its limit once a connection has authenticated).
    pub fn set_frame_bytes_max(&mut self, frame_bytes_max: u32) {
        *self = FrameDecoder::new(frame_bytes_max);
    }
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

/// Counts the messages in `body`, checking that they tile it exactly.
fn count_messages(body: &[u8]) -> Result<usize, DecodeError> {
    let mut offset = 0;
    let mut count = 0;
    while offset < body.len() {
        if body.len() - offset < HEADER_BYTES {
            return Err(DecodeError::HeaderTruncated { offset });
        }
        let payload_len = usize::from(u16::from_le_bytes([body[offset + 2], body[offset + 3]]));
        let end = offset + HEADER_BYTES + payload_len;
        if end > body.len() {
            return Err(DecodeError::PayloadOverrun { offset });
        }
        offset = end;
        count += 1;
    }
    Ok(count)
}

impl Decoder for FrameDecoder {
    type Item = Frame;
    type Error = DecodeError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        if src.len() < FRAME_PREFIX_BYTES {
            return Ok(None);
        }
        let len = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        if len > self.frame_bytes_max {
            return Err(DecodeError::FrameTooLarge {
                len,
                max: self.frame_bytes_max,
            });
        }
        if (len as usize) < HEADER_BYTES {
            return Err(DecodeError::FrameTooShort { len });
        }
        let total = FRAME_PREFIX_BYTES + len as usize;
        if src.len() < total {
            // The length is within the limit, so this reservation is bounded.
            src.reserve(total - src.len());
            return Ok(None);
        }
        let messages = count_messages(&src[FRAME_PREFIX_BYTES..total])?;
        src.advance(FRAME_PREFIX_BYTES);
        let body = src.split_to(len as usize).freeze();
        Ok(Some(Frame { body, messages }))
    }
}

/// A message header (flags 0) for a payload of `payload_len` bytes, for
/// [`FrameWriter::message_whole`].
#[inline]
pub fn message_header(op: u8, request_id: u32, payload_len: u16) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0] = op;
    h[2..4].copy_from_slice(&payload_len.to_le_bytes());
    h[4..8].copy_from_slice(&request_id.to_le_bytes());
    h
}

/// Builds frames into a buffer: messages are appended to the open frame,
/// and a new frame is started once the open one passes
/// [`WRITER_FRAME_BYTES_SOFT`].
#[derive(Debug, Default)]
pub struct FrameWriter {
    /// Offset in the buffer of the open frame's length prefix, if any.
    open: Option<usize>,
}

impl FrameWriter {
    /// A writer with no open frame.
    pub fn new() -> FrameWriter {
        FrameWriter { open: None }
    }

    /// Appends one message: header, then whatever `payload` writes. The
    /// payload must be at most `u16::MAX` bytes (asserted: payload sizes
    /// are bounded by the message types).
    #[inline]
    pub fn message(
        &mut self,
        buf: &mut BytesMut,
        op: u8,
        request_id: u32,
        payload: impl FnOnce(&mut BytesMut),
    ) {
        self.message_flagged(buf, op, 0, request_id, payload);
    }

    /// [`FrameWriter::message`] with the header's `flags` set (a request's
    /// priority class).
    #[inline]
    pub fn message_flagged(
        &mut self,
        buf: &mut BytesMut,
        op: u8,
        flags: u8,
        request_id: u32,
        payload: impl FnOnce(&mut BytesMut),
    ) {
        self.frame_for_message(buf);
        let header_at = buf.len();
        buf.put_u8(op);
        buf.put_u8(flags);
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        payload(buf);
        let payload_len = buf.len() - header_at - HEADER_BYTES;
        let payload_len = u16::try_from(payload_len).expect("payload fits a u16 length");
        buf[header_at + 2..header_at + 4].copy_from_slice(&payload_len.to_le_bytes());
    }

    /// Appends one whole message assembled by the caller: `m` is a header
    /// ([`message_header`]) and its payload. The hot replies build theirs
    /// on the stack and are copied once, where one `put` per field checks
    /// the buffer's room each time.
    #[inline]
    pub fn message_whole(&mut self, buf: &mut BytesMut, m: &[u8]) {
        debug_assert!(
            m.len() >= HEADER_BYTES
                && usize::from(u16::from_le_bytes([m[2], m[3]])) == m.len() - HEADER_BYTES
        );
        self.frame_for_message(buf);
        buf.extend_from_slice(m);
    }

    /// [`FrameWriter::message_whole`] for a message in two parts: `head`
    /// (a header and a fixed part) then `tail` (a key), copied straight
    /// into the buffer, with one check of its room.
    #[inline]
    pub fn message_parts(&mut self, buf: &mut BytesMut, head: &[u8], tail: &[u8]) {
        debug_assert!(
            head.len() >= HEADER_BYTES
                && usize::from(u16::from_le_bytes([head[2], head[3]]))
                    == head.len() + tail.len() - HEADER_BYTES
        );
        self.frame_for_message(buf);
        buf.reserve(head.len() + tail.len());
        buf.extend_from_slice(head);
        buf.extend_from_slice(tail);
    }

    /// Opens a frame for the next message, closing the open one first once
    /// it has passed [`WRITER_FRAME_BYTES_SOFT`].
    #[inline]
    fn frame_for_message(&mut self, buf: &mut BytesMut) {
        let start = match self.open {
            Some(start) if buf.len() - start < WRITER_FRAME_BYTES_SOFT => start,
            Some(start) => {
                Self::close_at(buf, start);
                Self::open_at(buf)
            }
            None => Self::open_at(buf),
        };
        self.open = Some(start);
    }

    /// Closes the open frame, if any; call before handing `buf` to I/O.
    #[inline]
    pub fn finish(&mut self, buf: &mut BytesMut) {
        if let Some(start) = self.open.take() {
            Self::close_at(buf, start);
        }
    }

    fn open_at(buf: &mut BytesMut) -> usize {
        let start = buf.len();
        buf.put_u32_le(0);
        start
    }

    fn close_at(buf: &mut BytesMut, start: usize) {
        let len =
            u32::try_from(buf.len() - start - FRAME_PREFIX_BYTES).expect("frame fits a u32 length");
        buf[start..start + FRAME_PREFIX_BYTES].copy_from_slice(&len.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], max: u32) -> Result<Vec<Frame>, DecodeError> {
        let mut d = FrameDecoder::new(max);
        let mut src = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(f) = d.decode(&mut src)? {
            out.push(f);
        }
        Ok(out)
    }

    #[test]
    fn writer_output_decodes() {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        w.message(&mut buf, 0x02, 7, |_| {});
        w.message(&mut buf, 0x02, 8, |b| b.put_slice(b"abc"));
        w.finish(&mut buf);
        let frames = decode_all(&buf, 1024).unwrap();
        assert_eq!(frames.len(), 1);
        let msgs: Vec<_> = frames[0].messages().collect();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            msgs[0].0,
            MessageHeader {
                op: 2,
                flags: 0,
                request_id: 7
            }
        );
        assert_eq!(msgs[1].1, b"abc");
    }

    #[test]
    fn writer_splits_large_output_into_frames() {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        for i in 0..10_000 {
            w.message(&mut buf, 0x02, i, |b| b.put_slice(&[0u8; 40]));
        }
        w.finish(&mut buf);
        let frames = decode_all(&buf, FRAME_BYTES_MAX_DEFAULT).unwrap();
        assert!(frames.len() > 1);
        assert_eq!(frames.iter().map(Frame::len).sum::<usize>(), 10_000);
        let ids: Vec<u32> = frames
            .iter()
            .flat_map(|f| f.messages().map(|(h, _)| h.request_id))
            .collect();
        assert_eq!(ids, (0..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn partial_input_waits() {
        let mut buf = BytesMut::new();
        let mut w = FrameWriter::new();
        w.message(&mut buf, 0x02, 1, |b| b.put_slice(b"xyz"));
        w.finish(&mut buf);
        for cut in 0..buf.len() {
            let mut d = FrameDecoder::default();
            let mut src = BytesMut::from(&buf[..cut]);
            assert!(d.decode(&mut src).unwrap().is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn oversized_length_is_rejected_before_buffering() {
        let mut src = BytesMut::from(&[0xff, 0xff, 0xff, 0x7f][..]);
        let cap = src.capacity();
        let err = FrameDecoder::new(1024).decode(&mut src).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::FrameTooLarge {
                len: 0x7fff_ffff,
                max: 1024
            }
        ));
        assert_eq!(err.status(), Status::FrameTooLarge);
        assert_eq!(src.capacity(), cap, "nothing was reserved");
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        // Length below one header.
        assert!(matches!(
            decode_all(&[4, 0, 0, 0, 1, 0, 0, 0], 1024),
            Err(DecodeError::FrameTooShort { len: 4 })
        ));
        // A body of 12 bytes: one empty message then 4 stray bytes.
        let mut b = vec![12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0];
        b.extend_from_slice(&[2, 0, 0, 0]);
        assert!(matches!(
            decode_all(&b, 1024),
            Err(DecodeError::HeaderTruncated { offset: 8 })
        ));
        // A payload length past the end.
        let b = [8, 0, 0, 0, 3, 0, 5, 0, 1, 0, 0, 0];
        assert!(matches!(
            decode_all(&b, 1024),
            Err(DecodeError::PayloadOverrun { offset: 0 })
        ));
    }
}
