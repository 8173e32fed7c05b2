//! The log flags of both binaries and their setup: structured logs on stderr, text or JSON.

use clap::{Args, ValueEnum};

use crate::flags;

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format on stderr: `text` for people, `json` (one object per line) for log pipelines.
    #[arg(long = flags::LOG_FORMAT, env = "BURST_PREFIX_LOG_FORMAT", value_enum,
          default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing directives such as
    /// `info,burst_prefix_operator=debug`.
    #[arg(long = flags::LOG_LEVEL, env = "RUST_LOG", default_value = "info")]
    pub log_level: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Installs the global subscriber; an invalid filter is an error naming the flag.
pub fn init(args: &LogArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| format!("--{} {:?}: {e}", flags::LOG_LEVEL, args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}
