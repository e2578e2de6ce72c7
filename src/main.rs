use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use confighash::app::{self, App, RunError};
use confighash::cli::{self, Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Stamp(args) => stamp(&args),
        Command::Serve(args) => serve(args),
        Command::Explain(args) => explain(&args),
        Command::Diff(args) => diff(&args),
        Command::Certs(args) => match cli::certs(&args) {
            Ok(paths) => {
                for p in paths {
                    println!("wrote {}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn diff(args: &cli::DiffArgs) -> ExitCode {
    match cli::diff(args, std::io::stdin().lock()) {
        Ok(report) => {
            for warning in &report.warnings {
                eprintln!("warning: {warning}");
            }
            let format = match args.output {
                cli::DiffFormat::Text => confighash::offline::diff::Format::Text,
                cli::DiffFormat::Json => confighash::offline::diff::Format::Json,
                cli::DiffFormat::Markdown => confighash::offline::diff::Format::Markdown,
            };
            use std::io::Write;
            let text = confighash::offline::diff::render(&report, format);
            if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
                eprintln!("error: writing the report: {e}");
                return ExitCode::from(2);
            }
            ExitCode::from(u8::from(report.rolls()))
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn stamp(args: &cli::StampArgs) -> ExitCode {
    match cli::stamp(args, std::io::stdin().lock()) {
        Ok(output) => {
            for warning in &output.warnings {
                eprintln!("warning: {warning}");
            }
            let mut stdout = std::io::stdout().lock();
            if let Err(e) = stdout
                .write_all(output.text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                eprintln!("error: writing the output: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn explain(args: &cli::ExplainArgs) -> ExitCode {
    // One TLS implementation for every client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(confighash::explain::EXIT_ERROR);
        }
    };
    let report = runtime.block_on(async {
        match confighash::explain::connect(args.kubeconfig.as_deref(), args.context.as_deref())
            .await
        {
            Ok(client) => match args.to_request() {
                Ok(request) => confighash::explain::run(client, &request).await,
                Err(e) => confighash::explain::Report {
                    text: String::new(),
                    errors: vec![e],
                    code: confighash::explain::EXIT_ERROR,
                },
            },
            Err(e) => confighash::explain::Report {
                text: String::new(),
                errors: vec![e],
                code: confighash::explain::EXIT_ERROR,
            },
        }
    });
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(report.text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        eprintln!("error: writing the output: {e}");
        return ExitCode::from(confighash::explain::EXIT_ERROR);
    }
    for e in &report.errors {
        eprintln!("error: {e}");
    }
    ExitCode::from(report.code)
}

fn serve(args: cli::ServeArgs) -> ExitCode {
    // Before any thread starts: the watcher's lists pass large blocks through the allocator.
    confighash::watcher::memory::tune_allocator();
    // The HTTP/2 library warns once per misbehaving connection (a rapid-reset client, say): a
    // client could write hundreds of lines a second. confighash counts those connections and logs
    // them at most once a minute itself; a filter that names h2 keeps its lines.
    let directives = if args.log_level.contains("h2") {
        args.log_level.clone()
    } else {
        format!("{},h2=error", args.log_level)
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&directives) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: --log-level {:?}: {e}", args.log_level);
            return ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    // One TLS implementation for the webhook and the Kubernetes client alike.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a TLS crypto provider was already installed");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = match args.to_config() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(error = %e, "confighash serve cannot start");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "confighash serve failed");
            ExitCode::FAILURE
        }
    }
}

/// Runs `confighash serve` until SIGTERM or SIGINT, then shuts down gracefully.
async fn run(mut config: app::Config) -> Result<(), RunError> {
    // Before anything opens files or connections.
    config.fit_open_files()?;
    let kube_config = kube::Config::infer()
        .await
        .map_err(|e| RunError::Client(kube::Error::InferConfig(e)))?;
    let cluster =
        confighash::cluster::Cluster::new(kube_config, app::READS).map_err(RunError::Client)?;
    App::from_config(config, cluster)
        .await?
        .run_until(app::shutdown_signal())
        .await
}
