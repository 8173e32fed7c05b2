//! `burst-prefix-tools`: developer tools kept apart from the serving binary, so that the
//! producer image carries only what serves.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "burst-prefix-tools",
    version,
    about = "burst-prefix developer tools: a self-contained demo and the placement simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the producer in-process on a built-in config with 4 fake replicas, send it one GRPO
    /// rollout burst over loopback HTTP, and print where it landed and the prefill it saved.
    Demo(demo::DemoArgs),
    /// Simulate a cluster's prefix caches under round-robin, least-loaded, approx-prefix,
    /// cache-aware, burst (windowed) and zero-wait placement on the same workload, and compare
    /// their prefill.
    Simulate(Box<burst_prefix_simulator::cli::SimulateArgs>),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Simulate(args) => match burst_prefix_simulator::cli::run(&args) {
            Ok(output) => {
                // A closed stdout (`... | head`) is not an error worth a panic.
                use std::io::Write;
                let _ = writeln!(std::io::stdout(), "{output}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("error: {}", message.replace('\n', " "));
                ExitCode::from(2)
            }
        },
    }
}
