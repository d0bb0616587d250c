//! A snapshot file as sluiced reads it at start. The input is the body
//! and a few header fields; the target seals it (magic, version, length,
//! checksum) so that the record decoder behind the checksum is what gets
//! fuzzed, and also feeds the raw bytes as they are. Neither may panic; a
//! file that decodes holds as many records as its header says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_server::snapshot::{checksum, decode, HEADER_BYTES, MAGIC, VERSION};

fuzz_target!(|data: &[u8]| {
    let _ = decode(data);
    if data.len() < 4 {
        return;
    }
    let (fields, body) = data.split_at(4);
    let chunks = u64::from(fields[0] % 8);
    let records = u64::from(u16::from_le_bytes([fields[1], fields[2]]));
    let mut file = vec![0u8; HEADER_BYTES];
    file[..8].copy_from_slice(&MAGIC);
    file[8..12].copy_from_slice(&VERSION.to_le_bytes());
    file[12..14].copy_from_slice(&u16::from(fields[3]).max(1).to_le_bytes());
    file[32..40].copy_from_slice(&chunks.to_le_bytes());
    file[40..48].copy_from_slice(&records.to_le_bytes());
    file[48..56].copy_from_slice(&(body.len() as u64).to_le_bytes());
    let sum = checksum(&file, body);
    file[56..64].copy_from_slice(&sum.to_le_bytes());
    file.extend_from_slice(body);
    if let Ok(loaded) = decode(&file) {
        assert_eq!(loaded.records.len() as u64, records);
    }
});
