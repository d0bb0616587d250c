//! A `RateLimitRequest` read where it lies: its strings are slices of the
//! call's message, not `String`s of their own.
//!
//! prost's decoding of envoy-types' owned messages allocated five times for
//! a one-descriptor call (the domain, the descriptor list, the entry list,
//! the key and the value) and copied every string: about 1.4k instructions
//! a call with the frees (benches/notes.md). [`Request::parse`] reads the
//! same message into two lists (descriptors, and every descriptor's entries
//! in one) of slices of it.
//!
//! prost stays the authority: the parse here takes only what it reads
//! exactly as prost would (each field's last value, a repeated message's
//! every occurrence, an optional message's occurrences merged field by
//! field, unknown fields skipped); anything else (a wire type that does not
//! fit its field, a string that is not UTF-8, a group, a message cut short)
//! returns `None`, and the caller decodes the message with prost for its
//! answer and error ([`Request::of`] reads prost's message the same way).
//! The unit tests check that on arbitrary bytes a parse here is prost's.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// A request descriptor's own limit (Envoy's `RateLimitOverride`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Override {
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`, Envoy's enum number.
    pub unit: i32,
}

/// One request descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Its entries: a range of [`Request::entries`]'s list.
    entries: (u32, u32),
    /// Its own limit, if it has one.
    pub limit: Option<Override>,
    /// Its `hits_addend` wrapper, if set (0 is a check).
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: give the units back.
    pub is_negative_hits: bool,
}

/// A `ShouldRateLimit` request, borrowing the message it was read from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'m> {
    /// The domain.
    pub domain: &'m str,
    /// The descriptors, in order.
    pub descriptors: Vec<Descriptor>,
    /// Every descriptor's `(key, value)` entries, one after the other.
    entries: Vec<(&'m str, &'m str)>,
    /// The request's `hits_addend` (0: unset).
    pub hits_addend: u32,
}

impl<'m> Request<'m> {
    /// Descriptor `d`'s `(key, value)` entries.
    #[inline]
    pub fn entries(&self, d: &Descriptor) -> &[(&'m str, &'m str)] {
        &self.entries[d.entries.0 as usize..d.entries.1 as usize]
    }

    /// `message` (one `RateLimitRequest`, no gRPC prefix), if it reads
    /// here exactly as prost reads it; `None` sends the caller to prost.
    pub fn parse(message: &'m [u8]) -> Option<Request<'m>> {
        let mut request = Request {
            domain: "",
            descriptors: Vec::with_capacity(4),
            entries: Vec::with_capacity(4),
            hits_addend: 0,
        };
        let mut r = Reader(message);
        while let Some((field, wire)) = r.key()? {
            match (field, wire) {
                (1, LEN) => request.domain = r.str()?,
                (2, LEN) => {
                    let d = request.descriptor(r.bytes()?)?;
                    request.descriptors.push(d);
                }
                (3, VARINT) => request.hits_addend = r.varint()? as u32,
                (1..=3, _) => return None,
                _ => r.skip(wire)?,
            }
        }
        Some(request)
    }

    /// One `RateLimitDescriptor` message, its entries appended to the
    /// request's.
    fn descriptor(&mut self, message: &'m [u8]) -> Option<Descriptor> {
        let first = u32::try_from(self.entries.len()).ok()?;
        let mut d = Descriptor::default();
        let mut r = Reader(message);
        while let Some((field, wire)) = r.key()? {
            match (field, wire) {
                (1, LEN) => {
                    let e = entry(r.bytes()?)?;
                    self.entries.push(e);
                }
                (2, LEN) => {
                    // An optional message met again is merged into the
                    // first, field by field (prost's, and protobuf's, rule).
                    let o = d.limit.get_or_insert_with(Override::default);
                    let mut r = Reader(r.bytes()?);
                    while let Some((field, wire)) = r.key()? {
                        match (field, wire) {
                            (1, VARINT) => o.requests_per_unit = r.varint()? as u32,
                            (2, VARINT) => o.unit = r.varint()? as i32,
                            (1 | 2, _) => return None,
                            _ => r.skip(wire)?,
                        }
                    }
                }
                (3, LEN) => {
                    let value = d.hits_addend.get_or_insert(0);
                    let mut r = Reader(r.bytes()?);
                    while let Some((field, wire)) = r.key()? {
                        match (field, wire) {
                            (1, VARINT) => *value = r.varint()?,
                            (1, _) => return None,
                            _ => r.skip(wire)?,
                        }
                    }
                }
                (4, VARINT) => d.is_negative_hits = r.varint()? != 0,
                (1..=4, _) => return None,
                _ => r.skip(wire)?,
            }
        }
        d.entries = (first, u32::try_from(self.entries.len()).ok()?);
        Some(d)
    }

    /// prost's decoding of a request, read as [`Request::parse`] reads one.
    pub fn of(owned: &'m RateLimitRequest) -> Request<'m> {
        let mut request = Request {
            domain: &owned.domain,
            descriptors: Vec::with_capacity(owned.descriptors.len()),
            entries: Vec::new(),
            hits_addend: owned.hits_addend,
        };
        for d in &owned.descriptors {
            let first = request.entries.len() as u32;
            request
                .entries
                .extend(d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())));
            request.descriptors.push(Descriptor {
                entries: (first, request.entries.len() as u32),
                limit: d.limit.as_ref().map(|o| Override {
                    requests_per_unit: o.requests_per_unit,
                    unit: o.unit,
                }),
                hits_addend: d.hits_addend.as_ref().map(|h| h.value),
                is_negative_hits: d.is_negative_hits,
            });
        }
        request
    }
}

/// One `Entry` message: its key and value.
fn entry(message: &[u8]) -> Option<(&str, &str)> {
    let (mut key, mut value) = ("", "");
    let mut r = Reader(message);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, LEN) => key = r.str()?,
            (2, LEN) => value = r.str()?,
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some((key, value))
}

/// Protobuf's wire types this reader knows: varint, 64-bit, length
/// delimited, 32-bit (groups, 3 and 4, send the message to prost).
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// What is left of a message to read.
struct Reader<'m>(&'m [u8]);

impl<'m> Reader<'m> {
    /// The next field's number and wire type; `Some(None)` at the end.
    #[inline]
    fn key(&mut self) -> Option<Option<(u32, u8)>> {
        if self.0.is_empty() {
            return Some(None);
        }
        // A key past 32 bits is refused by prost.
        let key = u32::try_from(self.varint()?).ok()?;
        let field = key >> 3;
        // Field 0 is no field (prost: invalid tag).
        (field > 0).then_some(Some((field, (key & 7) as u8)))
    }

    /// A varint of at most ten bytes whose value fits 64 bits.
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            if i == 9 && b > 1 {
                return None;
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.0 = &self.0[i + 1..];
                return Some(value);
            }
        }
        None
    }

    /// A length-delimited field's bytes.
    #[inline]
    fn bytes(&mut self) -> Option<&'m [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(bytes)
    }

    /// A string field (UTF-8, as prost requires).
    #[inline]
    fn str(&mut self) -> Option<&'m str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    /// Passes over an unknown field of wire type `wire`.
    fn skip(&mut self, wire: u8) -> Option<()> {
        let len = match wire {
            VARINT => return self.varint().map(drop),
            I64 => 8,
            LEN => return self.bytes().map(drop),
            I32 => 4,
            _ => return None,
        };
        self.0 = self.0.get(len..)?;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use proptest::prelude::*;
    use prost::Message;

    /// What prost makes of `bytes`, read as a [`Request`], if it decodes.
    fn by_prost(bytes: &[u8]) -> Option<RateLimitRequest> {
        RateLimitRequest::decode(bytes).ok()
    }

    fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
        (
            prop::collection::vec(("[a-z_/=%é]{0,6}", "[a-z0-9.=/]{0,8}"), 0..4),
            prop::option::of((any::<u32>(), -2i32..8)),
            prop::option::of(any::<u64>()),
            any::<bool>(),
        )
            .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect(),
                limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                    requests_per_unit,
                    unit,
                }),
                hits_addend: hits.map(|value| UInt64Value { value }),
                is_negative_hits: negative,
            })
    }

    fn request() -> impl Strategy<Value = RateLimitRequest> {
        (
            "[a-z]{0,8}",
            prop::collection::vec(descriptor(), 0..5),
            any::<u32>(),
        )
            .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
                domain,
                descriptors,
                hits_addend,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Every message prost writes is read here, as prost reads it:
        /// the fast path is the path (a parse that sent every call to
        /// prost would pass the test below and save nothing).
        #[test]
        fn reads_what_prost_writes(owned in request()) {
            let bytes = owned.encode_to_vec();
            let fast = Request::parse(&bytes);
            prop_assert_eq!(fast, Some(Request::of(&owned)));
        }

        /// On bytes changed anyhow (a byte replaced, cut, fields repeated
        /// or unknown ones added), a parse here is prost's decoding: it
        /// never reads a message prost refuses, nor reads one otherwise.
        #[test]
        fn never_reads_otherwise_than_prost(
            owned in request(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..4),
            extra in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            let mut bytes = owned.encode_to_vec();
            for (at, byte, how) in edits {
                match how {
                    0 if !bytes.is_empty() => {
                        let i = at.index(bytes.len());
                        bytes[i] = byte;
                    }
                    1 if !bytes.is_empty() => bytes.truncate(at.index(bytes.len())),
                    2 => bytes.extend_from_slice(&extra),
                    _ => {
                        let again = bytes.clone();
                        bytes.extend_from_slice(&again);
                    }
                }
            }
            if let Some(fast) = Request::parse(&bytes) {
                let decoded = by_prost(&bytes);
                prop_assert!(decoded.is_some(), "read here, refused by prost: {:?}", bytes);
                let decoded = decoded.unwrap();
                prop_assert_eq!(fast, Request::of(&decoded));
            }
        }
    }

    /// The rules prost follows that a generated message never exercises.
    #[test]
    fn repeated_and_unknown_fields_read_as_prost_reads_them() {
        let cases: &[&[u8]] = &[
            // domain twice: the last one.
            b"\x0a\x01a\x0a\x01b",
            // a descriptor whose limit comes twice: merged field by field.
            b"\x12\x0c\x12\x04\x08\x05\x10\x02\x12\x02\x08\x07\x20\x01",
            // unknown fields of every skippable wire type.
            b"\x20\x05\x29\x01\x02\x03\x04\x05\x06\x07\x08\x32\x01x\x3d\x01\x02\x03\x04\x0a\x01d",
            // hits_addend's wrapper twice, the second empty: the first's value stays.
            b"\x12\x06\x1a\x02\x08\x09\x1a\x00",
        ];
        for bytes in cases {
            let decoded = by_prost(bytes).expect("prost reads it");
            assert_eq!(
                Request::parse(bytes),
                Some(Request::of(&decoded)),
                "{bytes:?}"
            );
        }
    }

    /// What prost refuses is not read here (the caller asks prost, whose
    /// error the call answers).
    #[test]
    fn what_prost_refuses_is_left_to_prost() {
        let cases: &[&[u8]] = &[
            // domain as a varint: a wire type that does not fit.
            b"\x08\x01",
            // a string that is not UTF-8.
            b"\x0a\x02\xff\xfe",
            // a length past the end.
            b"\x0a\x05ab",
            // field number 0.
            b"\x02\x00",
            // an eleven-byte varint.
            b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            // a group end with no start.
            b"\x0c",
        ];
        for bytes in cases {
            assert!(by_prost(bytes).is_none(), "prost refuses {bytes:?}");
            assert_eq!(Request::parse(bytes), None, "{bytes:?}");
        }
    }
}
