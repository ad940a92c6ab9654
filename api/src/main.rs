use clap::Parser;
use herald_api::Config;

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
    herald_api::install_crypto_provider();
    herald_api::run(config, shutdown_signal()).await?;
    Ok(())
}

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
