//! The command line every bench shares. Each bench derives its own `clap::Parser` and flattens
//! [`CargoBench`] into it, so that `cargo bench -p burst-prefix-producer --bench NAME -- --help`
//! explains its flags and an unknown flag is an error, not silently ignored.

/// `cargo bench` runs every bench binary with `--bench`: accepted and ignored.
#[derive(clap::Args, Debug, Clone)]
pub struct CargoBench {
    #[arg(long = "bench", hide = true)]
    bench: bool,
}

/// A clap value parser for a number of seconds within `min..=max` (e.g. `--seconds`), so that
/// every loop of a bench stays bounded.
pub fn seconds_within(min: f64, max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |text: &str| {
        let seconds: f64 = text
            .parse()
            .map_err(|_| format!("expected a number of seconds, got {text:?}"))?;
        if (min..=max).contains(&seconds) {
            Ok(seconds)
        } else {
            Err(format!(
                "must be within {min}..={max} seconds, got {seconds}"
            ))
        }
    }
}
