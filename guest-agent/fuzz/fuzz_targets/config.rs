//! Config text → parse and validate (TOML and YAML).
#![no_main]

use std::path::Path;

use hcp_olm_guest_agent::server::file::FileConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for p in ["f.yaml", "f.toml"] {
        if let Ok(c) = FileConfig::parse(Path::new(p), text) {
            let _ = c.validate(None, None);
        }
    }
});
