//! Durations (`500ms`, `30s`, `5m`, `24h`, `7d`) and sizes (`512KiB`,
//! `1MiB`, `1000`) as written in flags and config files.

use std::time::Duration;

use anyhow::{Context, bail};

/// Parses a duration; a bare number is seconds.
pub(crate) fn duration(text: &str) -> anyhow::Result<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .with_context(|| format!("{text:?} is not a duration (like 30s, 5m, 24h)"))?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => bail!("{text:?}: unknown duration unit {other:?} (use ms, s, m, h or d)"),
    };
    Ok(Duration::from_millis(
        n.checked_mul(unit_ms)
            .with_context(|| format!("{text:?} is too long"))?,
    ))
}

/// Parses a size in bytes.
pub(crate) fn size(text: &str) -> anyhow::Result<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .with_context(|| format!("{text:?} is not a size (like 512KiB, 1MiB)"))?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "KB" => 1024,
        "MiB" | "M" | "MB" => 1024 * 1024,
        other => bail!("{text:?}: unknown size unit {other:?} (use B, KiB or MiB)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("7").unwrap(), Duration::from_secs(7));
        assert!(duration("soon").is_err());
        assert!(duration("5y").unwrap_err().to_string().contains("unit"));
        assert_eq!(size("1MiB").unwrap(), 1 << 20);
        assert_eq!(size("512KiB").unwrap(), 512 << 10);
        assert_eq!(size("100").unwrap(), 100);
        assert!(size("1GiB").is_err());
    }
}
