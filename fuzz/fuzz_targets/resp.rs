//! The RESP listener's parser (arrays, bulk strings, inline commands),
//! fed in reads of any size, and redis-cell's CL.THROTTLE argument parser
//! on every command it yields. Neither may panic, and a parsed command's
//! length stays within what was given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_protocol::cell::CellRequest;
use sluice_server::resp::parser::Parser;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(cut).max(1);
    let mut parser = Parser::new(1 << 16);
    let mut buf: Vec<u8> = Vec::new();
    for chunk in data.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match parser.parse(&buf) {
                Ok(Some(n)) => {
                    assert!(n > 0 && n <= buf.len(), "consumed {n} of {}", buf.len());
                    let args = parser.args(&buf);
                    let all: Vec<&[u8]> = args.iter().collect();
                    if all.len() > 1 {
                        let _ = CellRequest::parse(&all[1..]);
                    }
                    buf.drain(..n);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
