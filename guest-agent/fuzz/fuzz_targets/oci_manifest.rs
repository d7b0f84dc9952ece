//! Arbitrary bytes as a registry's manifest or image index (untrusted: any registry or
//! mirror a HostedCluster names): the parser must never panic, every digest it accepts is
//! `sha256:<64 hex>` (it goes into blob URLs), and an index's pick is one of its entries.
#![no_main]

use hcp_olm_oci::manifest::{MAX_MANIFEST_BYTES, Manifest, valid_digest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::parse(data) else {
        return;
    };
    assert!(data.len() as u64 <= MAX_MANIFEST_BYTES);
    match &m {
        Manifest::Index(list) => {
            assert!(!list.is_empty());
            assert!(list.iter().all(|e| valid_digest(&e.digest)));
            let pick = m.pick_platform().expect("an index has a pick");
            assert!(list.iter().any(|e| e.digest == pick));
        }
        Manifest::Image { config, layers } => {
            assert!(valid_digest(&config.digest));
            assert!(layers.iter().all(|l| valid_digest(&l.digest)));
            assert!(m.pick_platform().is_none());
        }
    }
});
