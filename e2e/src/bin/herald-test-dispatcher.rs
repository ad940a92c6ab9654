//! The dispatcher as a separate process, for tests that kill it (`kill -9`) or run
//! several replicas. Same flags as `herald-dispatcher`.

use clap::Parser;

/// The dispatcher binary's allocator (`dispatcher/src/main.rs`), so what is measured is
/// what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // Listen for SIGINT before anything else: a test may stop this process right after
    // starting it, and a signal that comes before the listener is lost when the process
    // inherited SIGINT ignored (as background jobs of a shell do).
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .expect("listening for SIGINT");
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,async_nats=warn".into()),
        )
        .init();
    let config = herald_dispatcher::Config::parse();
    herald_dispatcher::install_crypto_provider();
    // Stop with the test that started this process, even when it panicked or was killed.
    let orphaned = herald_e2e::orphaned();
    let shutdown = async {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = orphaned => {}
        }
    };
    if let Err(error) = herald_dispatcher::run(config, shutdown).await {
        eprintln!("dispatcher: {error}");
        std::process::exit(1);
    }
}
