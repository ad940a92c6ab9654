//! The operator as a separate process, for tests that kill it (`kill -9`) or run several
//! replicas. Same flags as `herald-operator run`.

use clap::Parser;

/// The allocator of `herald-operator` (its `main.rs` says why), so what the scale
/// harness measures is what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,async_nats=warn".into()),
        )
        .init();
    let config = herald_operator::Config::parse();
    // The operator's `main` installs ring as rustls' provider; this is the same one.
    herald_dispatcher::install_crypto_provider();
    // Stop with the test that started this process, even when it panicked or was killed.
    let orphaned = herald_e2e::orphaned();
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(term) => {
                    term.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
            _ = orphaned => {}
        }
    };
    if let Err(error) = herald_operator::run(config, shutdown).await {
        eprintln!("operator: {error}");
        std::process::exit(1);
    }
}
