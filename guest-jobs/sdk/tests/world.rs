//! The SDK carries its own copy of the world (so a scaffold's vendored SDK builds outside this
//! repository); it must be the world the host loads.

#[test]
fn the_sdks_world_is_the_hosts() {
    assert!(
        include_str!("../wit/job.wit") == include_str!("../../../wit/job.wit"),
        "guest-jobs/sdk/wit/job.wit differs from wit/job.wit: copy wit/job.wit over it"
    );
}
