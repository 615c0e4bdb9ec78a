//! `kvdrain sim` command-line arguments (clap).

use kvdrain_sim::{Broken, Shape, SimConfig};

/// `kvdrain sim` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Prints one JSON line ({\"requests\":N,\"violations\":0,\"faults\":{...},\"decisions\":{...},...});
exit status 0 without violations, 1 with (each printed on stderr with its step and the
command that reproduces it), 2 on bad arguments.

Example:
  kvdrain sim --seed 7 --requests 100000 --random-topology
  kvdrain sim --seed 3 --requests 2000 --p-tp 4 --p-pp 2 --d-tp 2")]
pub struct SimArgs {
    /// Seed of everything random (a seed replays the same run).
    #[arg(long, value_name = "S")]
    pub seed: u64,
    /// Client requests to simulate.
    #[arg(long, value_name = "N")]
    pub requests: u64,
    /// Producer tensor-parallel size.
    #[arg(
        long,
        value_name = "A",
        default_value_t = 2,
        conflicts_with = "random_topology"
    )]
    pub p_tp: u16,
    /// Producer pipeline-parallel size.
    #[arg(
        long,
        value_name = "B",
        default_value_t = 1,
        conflicts_with = "random_topology"
    )]
    pub p_pp: u16,
    /// Consumer tensor-parallel size.
    #[arg(
        long,
        value_name = "C",
        default_value_t = 1,
        conflicts_with = "random_topology"
    )]
    pub d_tp: u16,
    /// Draw a mixed topology per engine from the seed instead of the sizes.
    #[arg(long)]
    pub random_topology: bool,
    /// Turn on the late-landing fault: every other failed WRITE keeps landing after its
    /// error, which the consumers' settling must absorb.
    #[arg(long)]
    pub late_landing: bool,
    /// The consumers' settling after a failure notice or a producer's death, in virtual
    /// ms (default `timing::SETTLE`); the JSON line reports what it costs
    /// (`settle_hold_block_ms`).
    #[arg(long, value_name = "MS")]
    pub settle_ms: Option<u64>,
    /// Swap in a deliberately broken consumer, to show the checks fail.
    #[arg(long, value_enum, value_name = "VARIANT")]
    pub broken: Option<BrokenArg>,
}

/// `--broken` variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BrokenArg {
    /// Hands the blocks back at the abort instead of waiting for `released`.
    ReleaseOnAbort,
    /// Repeats notices to counting-mode requests too (vLLM's counting semantics).
    DuplicateCounting,
    /// No settling (`settle_ms = 0`, vLLM's behaviour) while every failed WRITE keeps
    /// landing after its error.
    NoSettle,
}

impl SimArgs {
    /// The simulation these arguments ask for.
    pub fn config(&self) -> SimConfig {
        let shape = if self.random_topology {
            Shape::Random
        } else {
            Shape::Fixed {
                p_tp: self.p_tp,
                p_pp: self.p_pp,
                d_tp: self.d_tp,
            }
        };
        let mut config = SimConfig::new(self.seed, self.requests, shape);
        if self.late_landing {
            config = config.with_late_landing();
        }
        if let Some(settle_ms) = self.settle_ms {
            config.settle_ms = settle_ms;
        }
        if let Some(broken) = self.broken {
            config = config.with_broken(match broken {
                BrokenArg::ReleaseOnAbort => Broken::ReleaseOnAbort,
                BrokenArg::DuplicateCounting => Broken::DuplicateCounting,
                BrokenArg::NoSettle => Broken::NoSettle,
            });
        }
        config
    }

    /// The arguments as a command line that reproduces the run.
    pub fn command_line(&self) -> String {
        let mut line = format!(
            "kvdrain sim --seed {} --requests {}",
            self.seed, self.requests
        );
        if self.random_topology {
            line.push_str(" --random-topology");
        } else {
            let sizes = format!(
                " --p-tp {} --p-pp {} --d-tp {}",
                self.p_tp, self.p_pp, self.d_tp
            );
            line.push_str(&sizes);
        }
        if self.late_landing {
            line.push_str(" --late-landing");
        }
        if let Some(settle_ms) = self.settle_ms {
            line.push_str(&format!(" --settle-ms {settle_ms}"));
        }
        match self.broken {
            Some(BrokenArg::ReleaseOnAbort) => line.push_str(" --broken release-on-abort"),
            Some(BrokenArg::DuplicateCounting) => line.push_str(" --broken duplicate-counting"),
            Some(BrokenArg::NoSettle) => line.push_str(" --broken no-settle"),
            None => {}
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Shape, SimArgs};

    #[derive(Debug, Parser)]
    struct Sim {
        #[command(flatten)]
        args: SimArgs,
    }

    fn parse(s: &str) -> Result<SimArgs, clap::Error> {
        Sim::try_parse_from(std::iter::once("sim").chain(s.split_whitespace())).map(|s| s.args)
    }

    #[test]
    fn fixed_random_and_errors() {
        let a = parse("--seed 3 --requests 10 --p-tp 4 --d-tp 2").expect("valid");
        let c = a.config();
        assert_eq!((c.seed, c.requests), (3, 10));
        let fixed = Shape::Fixed {
            p_tp: 4,
            p_pp: 1,
            d_tp: 2,
        };
        assert_eq!(c.shape, fixed);
        assert_eq!(
            a.command_line(),
            "kvdrain sim --seed 3 --requests 10 --p-tp 4 --p-pp 1 --d-tp 2"
        );
        let c = parse("--seed 1 --requests 1 --random-topology").expect("valid");
        assert_eq!(c.config().shape, Shape::Random);
        assert!(parse("--requests 1").is_err());
        assert!(parse("--seed 1 --requests 1 --random-topology --p-tp 2").is_err());
        assert!(parse("--seed 1 --requests x").is_err());
        assert!(parse("--seed 1 --requests 1 --broken nope").is_err());
        let c = parse("--seed 1 --requests 1 --late-landing").expect("valid");
        assert_eq!(
            c.command_line(),
            "kvdrain sim --seed 1 --requests 1 --p-tp 2 --p-pp 1 --d-tp 1 --late-landing"
        );
        let c = c.config();
        assert_eq!(
            (c.rates.late_landing, c.settle_ms),
            (500_000, kvdrain_sim::timing::SETTLE)
        );
        let c = parse("--seed 1 --requests 1 --broken no-settle")
            .expect("valid")
            .config();
        assert_eq!((c.rates.late_landing, c.settle_ms), (1_000_000, 0));
        let a = parse("--seed 1 --requests 1 --settle-ms 5000").expect("valid");
        assert_eq!(a.config().settle_ms, 5000);
        assert!(a.command_line().ends_with(" --settle-ms 5000"));
    }
}
