use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use herald_operator::Config;

/// The operator's memory per endpoint is what its caches hold plus what the allocator
/// keeps around them: glibc's malloc kept about 0.8 KB per endpoint free between live
/// blocks after a creation burst; with mimalloc the operator held 2.02 KiB per endpoint
/// at 20,000 instead of 2.41 (docs/scale.md, "mimalloc"). The scale harness's operator
/// binary uses the same allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Herald's operator.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML, or write one file per kind into --out.
    Crd {
        /// Directory to write `<plural>.herald.dev.yaml` files into.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the Helm chart's CRD templates (`crds.install` wrapper,
        /// `helm.sh/resource-policy: keep`) into this directory, e.g.
        /// `charts/herald/templates/crds`.
        #[arg(long)]
        chart_out: Option<PathBuf>,
    },
    /// Reconcile Herald's resources (the leader replica) or stand by.
    Run(Box<Config>),
}

fn main() -> anyhow::Result<()> {
    let Cli { command } = Cli::parse();
    match command {
        Command::Crd { out, chart_out } => {
            // Print to stdout only when asked for no files at all.
            if out.is_some() || chart_out.is_none() {
                write_crds(out)?;
            }
            match chart_out {
                Some(dir) => write_files(&dir, herald_operator::crdgen::render_chart_all()?),
                None => Ok(()),
            }
        }
        Command::Run(config) => run(*config),
    }
}

fn run(config: Config) -> anyhow::Result<()> {
    init_tracing(config.json_logs);
    // kube is built with ring; install it as rustls' process-wide provider once, so no
    // dependency can pick a different one.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?
        .block_on(herald_operator::run(config, shutdown_signal()))
        .context("herald-operator")
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// SIGTERM (Kubernetes) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    let rendered = herald_operator::crdgen::render_all()?;
    match out {
        None => {
            let docs: Vec<&str> = rendered.iter().map(|(_, yaml)| yaml.as_str()).collect();
            print!("{}", docs.join("---\n"));
        }
        Some(dir) => write_files(&dir, rendered)?,
    }
    Ok(())
}

fn write_files(dir: &std::path::Path, files: Vec<(&str, String)>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, yaml) in files {
        let path = dir.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
