use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use confighash::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Stamp(args) => match cli::stamp(&args, std::io::stdin().lock()) {
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
        },
    }
}
