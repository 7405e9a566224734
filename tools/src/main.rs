//! `orbitkv`: the operator command line. Commands print results on stdout (one JSON document with
//! `--json`), a one-line reason on stderr when they refuse, and exit with the codes in the README.

mod cmd;
mod config;
mod output;
mod size;
mod tokens;
mod trace;
mod tracegen;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for success.
pub const EXIT_OK: u8 = 0;
/// Exit code for an unexpected internal failure (e.g. stdout closed).
pub const EXIT_INTERNAL: u8 = 1;
/// Exit code for refused input or a usage error (clap uses it too).
pub const EXIT_REFUSED: u8 = 2;

/// A command's failure: its exit code and the one-line reason printed on stderr.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Refused input (exit 2).
    pub fn refused(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_REFUSED,
            message: message.into(),
        }
    }
    /// Internal failure (exit 1).
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_INTERNAL,
            message: message.into(),
        }
    }
    /// A command-specific exit code (documented per command in the README).
    pub fn with_code(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[derive(Parser)]
#[command(
    name = "orbitkv",
    version,
    about = "OrbitKV: a KV-state store for LLM inference engines",
    propagate_version = true
)]
struct Cli {
    /// Print a single JSON document on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the computation identity of a model directory or hub snapshot.
    Identity(cmd::identity::IdentityArgs),
    /// Compute an engine's native prefix hashes, bit-exact with the engine.
    Hash {
        #[command(subcommand)]
        engine: cmd::hash::HashCommand,
    },
    /// Deterministic self-test and burn-in against a store.
    Bench {
        #[command(subcommand)]
        cmd: cmd::bench::BenchCommand,
    },
    /// Verify every record and the manifest; repair on request (exit codes as e2fsck).
    Fsck(cmd::store::FsckArgs),
    /// Show namespaces, segments and their live fractions (read-only).
    Inspect(cmd::store::InspectArgs),
    /// Rewrite sealed segments below a live fraction, dropping dead records.
    Compact(cmd::store::CompactArgs),
    /// Retire a namespace: none of its older records is served again.
    Retire(cmd::store::RetireArgs),
    /// Run the cache manager daemon on this node (embedded defaults; SIGTERM stops it cleanly).
    Serve(cmd::serve::ServeArgs),
    /// Ask a running daemon for its metrics, to retire a namespace, or to sync.
    Admin(cmd::admin::AdminArgs),
    /// Run a simulated engine instance against a daemon, checking every byte it loads.
    EngineSim(cmd::engine_sim::EngineSimArgs),
    /// Run N simulated engines concurrently against a daemon, replaying a trace.
    Loadgen(cmd::loadgen::LoadgenArgs),
    /// Kill a daemon under load with SIGKILL again and again; check no acknowledged publish is lost.
    Crashtest(cmd::crashtest::CrashtestArgs),
}

/// Sends `tracing` logs to stderr at `explicit` (a flag), else ORBITKV_LOG, else `fallback`
/// (a configuration file's), else warn.
pub fn init_logging(explicit: Option<&str>, fallback: Option<&str>) -> Result<(), Failure> {
    let env = std::env::var("ORBITKV_LOG").ok().filter(|l| !l.is_empty());
    let level = match explicit.or(env.as_deref()).or(fallback) {
        None | Some("") | Some("warn") => tracing::Level::WARN,
        Some("error") => tracing::Level::ERROR,
        Some("info") => tracing::Level::INFO,
        Some("debug") => tracing::Level::DEBUG,
        Some("trace") => tracing::Level::TRACE,
        Some(other) => {
            return Err(Failure::refused(format!(
                "unknown log level {other:?} (error, warn, info, debug, trace)"
            )));
        }
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        // Colour codes only for a person watching: a log file or pipe gets plain fields.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

fn run(cli: Cli) -> Result<(), Failure> {
    // The daemon picks its level from its flags and configuration file.
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging(None, None)?;
    }
    let out = output::Output::new(cli.json);
    match cli.command {
        Command::Identity(args) => cmd::identity::run(&args, &out),
        Command::Hash { engine } => cmd::hash::run(&engine, &out),
        Command::Bench { cmd } => cmd::bench::run(&cmd, &out),
        Command::Fsck(a) => cmd::store::fsck(&a, &out),
        Command::Inspect(a) => cmd::store::inspect(&a, &out),
        Command::Compact(a) => cmd::store::compact(&a, &out),
        Command::Retire(a) => cmd::store::retire(&a, &out),
        Command::Serve(a) => cmd::serve::run(&a, &out),
        Command::Admin(a) => cmd::admin::run(&a, &out),
        Command::EngineSim(a) => cmd::engine_sim::run(&a, &out),
        Command::Loadgen(a) => cmd::loadgen::run(&a, &out),
        Command::Crashtest(a) => cmd::crashtest::run(&a, &out),
    }
}

/// Usage errors on one line: clap's message up to its usage block, lines joined.
fn usage_error(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .collect();
    let joined = message.join(" ");
    let joined = joined.strip_prefix("error: ").unwrap_or(&joined);
    format!("{joined} (see 'orbitkv --help')")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                // Help and version go to stdout; a failed write has nowhere else to go.
                let _ = e.print();
                return ExitCode::from(EXIT_OK);
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // No command at all: the help is the most useful answer (on stderr).
                let _ = e.print();
                return ExitCode::from(EXIT_REFUSED);
            }
            eprintln!("orbitkv: {}", usage_error(&e));
            return ExitCode::from(EXIT_REFUSED);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(f) => {
            eprintln!("orbitkv: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
