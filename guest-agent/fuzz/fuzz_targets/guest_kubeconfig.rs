//! Arbitrary bytes as a guest admin kubeconfig Secret (untrusted: whoever can write the
//! HostedCluster's namespace): the check must never panic, and whatever it accepts carries no
//! exec plugin, auth provider, file path or proxy in any cluster or user entry.
#![no_main]

use hcp_olm_kubeconfig_check::check;
use libfuzzer_sys::fuzz_target;

const NEVER: &[&str] = &[
    "exec",
    "auth-provider",
    "tokenFile",
    "client-certificate",
    "client-key",
    "certificate-authority",
    "proxy-url",
];

fuzz_target!(|data: &[u8]| {
    if check(data).is_err() {
        return;
    }
    let Ok(serde_yaml_ng::Value::Mapping(top)) =
        serde_yaml_ng::from_slice::<serde_yaml_ng::Value>(data)
    else {
        return;
    };
    for (list, inner) in [("clusters", "cluster"), ("users", "user")] {
        let Some(serde_yaml_ng::Value::Sequence(entries)) = top.get(list) else {
            continue;
        };
        for e in entries {
            if let Some(serde_yaml_ng::Value::Mapping(body)) = e.get(inner) {
                for k in NEVER {
                    assert!(body.get(*k).is_none(), "accepted {list}.{inner}.{k}");
                }
            }
        }
    }
});
