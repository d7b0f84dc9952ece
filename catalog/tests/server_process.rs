//! The server binary: health answers SERVING for any service name once
//! loaded, Watch is unimplemented (as in opm), reflection lists the services,
//! and SIGTERM shuts it down gracefully (exit 0).

mod common;

use std::time::{Duration, Instant};

use hcp_olm_proto::health::HealthCheckRequest;
use hcp_olm_proto::health::health_client::HealthClient;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_graceful_shutdown() {
    let logs = tempfile::tempdir().expect("tempdir");
    let server = common::start_ours(&common::fixture("small"), logs.path()).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.port))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(ch);
    for service in ["", "api.Registry", "no.such.Service"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("check");
        assert_eq!(r.into_inner().status, 1, "{service}");
    }
    let err = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect_err("watch");
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    let pid = server.process.pid().expect("pid");
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(s) = server.process.exited() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no exit after SIGTERM:\n{}",
            server.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(exit.code(), Some(0), "{}", server.process.log_tail(20));
    assert!(server.process.log_tail(5).contains("shutting down"));
}
