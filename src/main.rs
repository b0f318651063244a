use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gpu_share::cli::{Cli, Command};

fn main() -> ExitCode {
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        eprintln!("a rustls crypto provider was already installed");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    gpu_share::telemetry::init(cli.log_format);
    match cli.command {
        Command::CheckPolicy { file } => check_policy(&file),
        Command::Serve(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(gpu_share::server::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_policy(file: &std::path::Path) -> ExitCode {
    match gpu_share::server::load_policy(&file.to_path_buf()) {
        Ok(policy) => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "# {}: valid. Effective policy:", file.display());
            let _ = write!(out, "{}", policy.to_yaml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{e}");
            ExitCode::FAILURE
        }
    }
}
