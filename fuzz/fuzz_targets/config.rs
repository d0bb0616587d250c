//! What operators write: a config file's text (TOML, with its tiers) and
//! a limit spec on its own (`token-bucket:100/s,burst=20`, ...), with or
//! without reserves (`...,reserve=critical:20%`). Neither may panic; a spec
//! that parses prints back to one that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_protocol::{Limit, Reserved};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = sluice_server::config::tiers_of_file_text(text);
    if let Ok(limit) = text.parse::<Limit>() {
        let printed = limit.to_string();
        let again: Limit = printed.parse().unwrap_or_else(|e| {
            panic!("{text:?} printed as {printed:?}, which does not parse: {e}")
        });
        assert_eq!(limit, again, "{text:?} -> {printed:?}");
    }
    if let Ok(reserved) = text.parse::<Reserved>() {
        let printed = reserved.to_string();
        let again: Reserved = printed.parse().unwrap_or_else(|e| {
            panic!("{text:?} printed as {printed:?}, which does not parse: {e}")
        });
        assert_eq!(reserved, again, "{text:?} -> {printed:?}");
        assert!(reserved.reserves.validate().is_ok(), "{text:?}");
    }
});
