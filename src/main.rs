use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gpu_share::cli::{Cli, Command};

/// mimalloc, not the system allocator: the extender keeps a long-lived ledger (hundreds of
/// thousands of small objects) while every request allocates and frees large temporary bodies
/// on several threads; glibc's per-thread arenas hold the freed pages around the long-lived
/// objects (docs/performance.md: the RSS at 150,000 pods).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        Command::Certs(args) => certs(&args),
        Command::Simulate(args) => finish(
            "gpu-share simulate: ",
            gpu_share_simulator::driver::run(&args),
        ),
        Command::Status(args) => match runtime(false) {
            Ok(r) => r.block_on(status(args)),
            Err(code) => code,
        },
        Command::Reserve(args) => match runtime(false) {
            Ok(r) => served(r.block_on(gpu_share_agent::run(&args))),
            Err(code) => code,
        },
        Command::Serve(args) => match runtime(true) {
            Ok(r) => served(r.block_on(gpu_share::server::run(*args))),
            Err(code) => code,
        },
    }
}

/// The async runtime: on every core for `serve`, on this thread for the one-shot commands.
fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(|e| {
        tracing::error!(error = %e, "cannot start the async runtime");
        ExitCode::FAILURE
    })
}

/// A long-running command's end: its error logged.
fn served<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a command's output and succeeds, or prints its error after `prefix` and fails.
fn finish<E: std::fmt::Display>(prefix: &str, result: Result<String, E>) -> ExitCode {
    match result {
        Ok(text) => {
            let _ = write!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{prefix}{e}");
            ExitCode::FAILURE
        }
    }
}

fn check_policy(file: &std::path::Path) -> ExitCode {
    use std::fmt::Write as _;
    let report = gpu_share::server::load_policy_file(&file.to_path_buf()).map(|(loaded, _)| {
        let mut out = String::new();
        let _ = writeln!(out, "# {}: valid.", file.display());
        for w in &loaded.warnings {
            let _ = writeln!(out, "# warning: {w}");
        }
        if loaded.defaulted.is_empty() {
            let _ = writeln!(out, "# Every field is set in the file.");
        } else {
            let named: Vec<String> = loaded
                .defaulted
                .iter()
                .map(|f| {
                    if gpu_share::policy::UNSET_BY_DEFAULT.contains(f) {
                        format!("{f} (unset)")
                    } else {
                        f.to_string()
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "# Left out, so the embedded default's values: {}.",
                named.join(", ")
            );
        }
        let _ = writeln!(out, "# Effective policy:");
        out.push_str(&loaded.policy.to_yaml());
        out
    });
    finish("", report)
}

async fn status(args: gpu_share::cli::StatusArgs) -> ExitCode {
    let output = if args.json {
        gpu_share::status::Output::Json
    } else {
        args.output
    };
    let policy = match (&args.server, &args.policy) {
        (None, Some(p)) => match gpu_share::server::load_policy(p) {
            Ok(p) => p,
            Err(e) => return finish("", Err(e)),
        },
        _ => gpu_share::policy::Policy::default_policy(),
    };
    let access = gpu_share::status::ClusterAccess {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        namespace: args.namespace.clone(),
    };
    let read = || async {
        let listed = match &args.server {
            Some(url) => gpu_share::status::from_server(url, args.ca.as_deref(), args.insecure)
                .await
                .map(|(r, quotas)| (r, None, quotas.map(Ok))),
            None => gpu_share::status::from_cluster(&policy, &access)
                .await
                .map(|f| (f.reports, Some(f.pending), Some(f.quotas))),
        };
        listed.map(|(r, pending, quotas)| {
            gpu_share::status::format(&r, pending.as_deref(), quotas.as_ref(), output)
        })
    };
    if !args.watch {
        return finish("gpu-share status: ", read().await);
    }
    // As `kubectl get -w`: the listing, then again each time it changes. A failed read is said
    // and retried; the watch ends on an interrupt.
    let mut last = String::new();
    loop {
        match read().await {
            Ok(text) if text != last => {
                if !last.is_empty() && output.is_table() {
                    println!();
                }
                print!("{text}");
                last = text;
            }
            Ok(_) => {}
            Err(e) => eprintln!("gpu-share status: {e} (trying again)"),
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
            _ = tokio::time::sleep(gpu_share::status::WATCH_EVERY) => {}
        }
    }
}

fn certs(args: &gpu_share::cli::CertsArgs) -> ExitCode {
    finish(
        "gpu-share certs: ",
        gpu_share::certs::write_install_bundle(&gpu_share::certs::Install {
            namespace: &args.namespace,
            service: &args.service,
            sans: &args.sans(),
            days: args.days,
            out: &args.out,
        }),
    )
}
