use std::path::Path;

use hcp_olm_guest_agent::dns::Engine;
use hcp_olm_guest_agent::server::file::FileConfig;

const CONFIG: &str = r#"
listen: 127.0.0.1:0
dns:
  cluster_domain: cluster.local
  upstreams: { local: ["127.0.0.1:1053"], guest: ["127.0.0.2:2053"] }
  rules:
    - { suffix: svc.cluster.local, owner: guest }
    - { suffix: svc.cluster.local, namespace: clusters-hc1, owner: local }
    - { suffix: blocked.test, owner: refuse }
    - { suffix: ".", owner: local }
  cache: { max_entries: 256 }
"#;

pub fn engine() -> Engine {
    let cfg = FileConfig::parse(Path::new("fuzz.yaml"), CONFIG)
        .and_then(|c| c.validate(None, None))
        .expect("fuzz config is valid");
    Engine::new(cfg.engine)
}
