//! `kvdrain sim` command-line arguments.

use super::cluster::Shape;
use super::{Broken, SimConfig};

/// The usage line.
pub const USAGE: &str = "usage: kvdrain sim --seed S --requests N \
[--p-tp A --p-pp B --d-tp C | --random-topology] \
[--late-landing] [--broken release-on-abort|duplicate-counting|no-settle]";

fn number<T: std::str::FromStr>(flag: &str, value: Option<&String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value
        .parse()
        .map_err(|_| format!("{flag}: {value:?} is not a valid number"))
}

/// Parses the arguments after `sim`.
///
/// # Errors
/// What is wrong with them.
pub fn parse(args: &[String]) -> Result<SimConfig, String> {
    let mut seed = None;
    let mut requests = None;
    let (mut p_tp, mut p_pp, mut d_tp) = (None, None, None);
    let mut random = false;
    let mut broken = None;
    let mut late_landing = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--seed" => seed = Some(number(flag, it.next())?),
            "--requests" => requests = Some(number(flag, it.next())?),
            "--p-tp" => p_tp = Some(number(flag, it.next())?),
            "--p-pp" => p_pp = Some(number(flag, it.next())?),
            "--d-tp" => d_tp = Some(number(flag, it.next())?),
            "--random-topology" => random = true,
            "--late-landing" => late_landing = true,
            "--broken" => match it.next().map(String::as_str) {
                Some("release-on-abort") => broken = Some(Broken::ReleaseOnAbort),
                Some("duplicate-counting") => broken = Some(Broken::DuplicateCounting),
                Some("no-settle") => broken = Some(Broken::NoSettle),
                other => return Err(format!("--broken: unknown variant {other:?}")),
            },
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let fixed = p_tp.is_some() || p_pp.is_some() || d_tp.is_some();
    let shape = match (random, fixed) {
        (true, true) => return Err("give --random-topology or the sizes, not both".into()),
        (true, false) => Shape::Random,
        (false, _) => Shape::Fixed {
            p_tp: p_tp.unwrap_or(2),
            p_pp: p_pp.unwrap_or(1),
            d_tp: d_tp.unwrap_or(1),
        },
    };
    let mut config = SimConfig::new(
        seed.ok_or("--seed is required")?,
        requests.ok_or("--requests is required")?,
        shape,
    );
    if late_landing {
        config = config.with_late_landing();
    }
    if let Some(broken) = broken {
        config = config.with_broken(broken);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::{Shape, parse};

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn fixed_random_and_errors() {
        let c = parse(&args("--seed 3 --requests 10 --p-tp 4 --d-tp 2")).unwrap();
        assert_eq!((c.seed, c.requests), (3, 10));
        let fixed = Shape::Fixed {
            p_tp: 4,
            p_pp: 1,
            d_tp: 2,
        };
        assert_eq!(c.shape, fixed);
        let c = parse(&args("--seed 1 --requests 1 --random-topology")).unwrap();
        assert_eq!(c.shape, Shape::Random);
        assert!(parse(&args("--requests 1")).is_err());
        assert!(parse(&args("--seed 1 --requests 1 --random-topology --p-tp 2")).is_err());
        assert!(parse(&args("--seed 1 --requests x")).is_err());
        assert!(parse(&args("--seed 1 --requests 1 --broken nope")).is_err());
        let c = parse(&args("--seed 1 --requests 1 --late-landing")).unwrap();
        assert_eq!(
            (c.rates.late_landing, c.settle_ms),
            (500_000, super::super::timing::SETTLE)
        );
        let c = parse(&args("--seed 1 --requests 1 --broken no-settle")).unwrap();
        assert_eq!((c.rates.late_landing, c.settle_ms), (1_000_000, 0));
    }
}
