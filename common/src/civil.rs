//! UTC calendar time from Unix time without a time-zone crate (Howard Hinnant's `civil_from_days`),
//! and the few formats ctxscope writes: `2025-11-29 13:05:07` for people, RFC 3339 for machines.

/// (year, month 1-12, day 1-31) of the UTC date `days` after 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in seconds.
pub fn datetime(unix_secs: u64) -> String {
    let (year, month, day) = civil_from_days((unix_secs / 86_400) as i64);
    let rem = unix_secs % 86_400;
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// RFC 3339 in UTC with `digits` (0-9) fractional digits of `nanos`: `2025-11-29T13:05:07.123Z`.
pub fn rfc3339(unix_secs: u64, nanos: u32, digits: usize) -> String {
    let date = datetime(unix_secs).replace(' ', "T");
    match digits.min(9) {
        0 => format!("{date}Z"),
        d => format!("{date}.{:0width$}Z", nanos / 10u32.pow(9 - d as u32), width = d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_421), (2025, 11, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn formats() {
        assert_eq!(datetime(0), "1970-01-01 00:00:00");
        assert_eq!(datetime(1_764_415_200), "2025-11-29 11:20:00");
        assert_eq!(rfc3339(1_764_422_707, 123_456_789, 3), "2025-11-29T13:25:07.123Z");
        assert_eq!(rfc3339(1_764_422_707, 123_456_789, 9), "2025-11-29T13:25:07.123456789Z");
        assert_eq!(rfc3339(1_764_422_707, 5, 0), "2025-11-29T13:25:07Z");
    }
}
