//! The profile's memory check against the server's own planner: the appliance's estimate
//! (`appliance::plan::requirement`, which sizes the unit's limits) must cover what
//! `llm-server plan` computes for the same model file, context and slots, or the server would
//! refuse to start (exit 2) inside the limits the image gives it.

use appliance::Profile;
use llm_server::gguf::Gguf;
use llm_server::plan::MemoryPlan;

#[test]
fn profile_estimate_covers_the_servers_plan() {
    let profile = Profile::load(&test_support::default_profile()).unwrap();
    let model = test_support::default_model();
    assert_eq!(
        model.file_name().unwrap().to_str().unwrap(),
        profile.model.file
    );
    let gguf = Gguf::open(&model).unwrap();
    let server = &profile.server;
    let plan =
        MemoryPlan::for_model_file(&gguf, server.ctx_size as usize, server.parallel as usize)
            .unwrap();
    let estimate = appliance::plan::requirement(&profile.model, server);
    eprintln!(
        "server plan {} MiB (weights {}, anonymous {}); appliance estimate {} MiB",
        plan.total() >> 20,
        plan.weights_bytes >> 20,
        plan.anonymous_bytes() >> 20,
        estimate.total() >> 20
    );
    assert!(
        estimate.total() >= plan.total(),
        "the profile's estimate ({} B) is below the server's plan ({} B): the unit limits it sizes would be too small",
        estimate.total(),
        plan.total()
    );
}
