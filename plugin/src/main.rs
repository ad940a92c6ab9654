//! `kubectl-herald`: kubectl finds it on PATH and runs it as `kubectl herald ...`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = kubectl_herald::Cli::parse();
    // kube is built with ring; one process-wide rustls provider for it and reqwest.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(kubectl_herald::run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
