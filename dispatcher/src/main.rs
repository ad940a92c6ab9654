use clap::Parser;
use herald_dispatcher::Config;

/// A delivery allocates and frees small objects on whichever worker thread its futures
/// run (messages, headers, requests, responses); glibc's malloc spent a large part of the
/// benchmark's allocator time consolidating and locking arenas across threads
/// (`docs/bench/profile.md`). The benchmark's binaries use the same allocator, so what is
/// measured is what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,async_nats=warn".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    if config.json_logs {
        logs.json().init();
    } else {
        logs.init();
    }
    herald_dispatcher::install_crypto_provider();
    herald_dispatcher::run(config, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
