use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

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
    },
}

fn main() -> anyhow::Result<()> {
    let Cli { command } = Cli::parse();
    match command {
        Command::Crd { out } => write_crds(out),
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    let rendered = herald_operator::crdgen::render_all()?;
    match out {
        None => {
            let docs: Vec<&str> = rendered.iter().map(|(_, yaml)| yaml.as_str()).collect();
            print!("{}", docs.join("---\n"));
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (file, yaml) in rendered {
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}
