//! The benchmark's smoke (`herald-bench --smoke` in the shared test environment): every
//! scenario at a tiny size, once. Each must produce numbers and deliver every event it
//! published (to its healthy endpoints), ordered endpoints must keep order, released
//! delivery state must be released; the report and the plots must be drawn from them.

use std::path::PathBuf;
use std::time::Instant;

use herald_e2e::bench::{self, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_benchmark_scenario_produces_numbers_and_delivers_every_event() {
    herald_dispatcher::install_crypto_provider();
    let mut options = Options::full().smoke();
    // herald-test-dispatcher (memory) and herald-replicas, built by cargo for this test
    // (or copies of them in HERALD_BENCH_BIN_DIR, for a target directory others share).
    let dispatcher = PathBuf::from(env!("CARGO_BIN_EXE_herald-test-dispatcher"));
    options.bin_dir = std::env::var_os("HERALD_BENCH_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| dispatcher.parent().map(PathBuf::from));
    assert!(PathBuf::from(env!("CARGO_BIN_EXE_herald-replicas")).exists());
    let started = Instant::now();
    let results = bench::run(herald_e2e::env(), &options).await;
    let problems = results.problems(&options);
    assert!(
        problems.is_empty(),
        "the smoke found problems: {problems:#?}"
    );

    let dir = std::env::temp_dir().join(herald_e2e::unique_name("bench-smoke"));
    let written = bench::plots::write_all(&results, &options, &dir).expect("drawing the plots");
    assert_eq!(
        written,
        [
            "throughput.svg",
            "latency.svg",
            "isolation.svg",
            "recovery.svg"
        ]
    );
    for name in &written {
        let svg = std::fs::read_to_string(dir.join(name)).expect("a plot");
        assert!(
            svg.starts_with("<svg") && (svg.contains("<polyline") || svg.contains("<rect")),
            "{name} is not a drawn SVG"
        );
        assert!(svg.contains("<text"), "{name} has no labels");
    }
    let md = bench::report::markdown(&results, &options, "plots");
    for section in [
        "## Against the targets",
        "## Throughput by scenario",
        "## Latency by load",
        "## Isolation",
        "## Recovery",
        "## Ordered delivery",
        "## Memory",
        "## Sharding",
    ] {
        assert!(md.contains(section), "the report lacks {section}:\n{md}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "benchmark smoke: {} scenarios in {:.0} s",
        options.scenarios.len(),
        started.elapsed().as_secs_f64()
    );
}
