//! `--cpu-list`: which CPU each shard thread runs on.
//!
//! Unpinned (the default), the kernel moves shard threads between CPUs as
//! it likes. Pinned, shard `i` runs on the `i`-th CPU of the list
//! (wrapping around when there are more shards than CPUs), so its table
//! stays in that core's caches, and a follower or a load generator on the
//! same machine can be kept on other cores (Redis's `server_cpulist` does
//! the same). The list is checked against the CPUs this process may use
//! before any shard starts.

use std::fmt;
use std::str::FromStr;

/// Highest CPU number a list may name (the kernel's `cpu_set_t` holds
/// 1024).
pub const CPU_MAX: u16 = 1023;

/// A parsed `--cpu-list`: CPUs in the order given, like `0,2,4-7`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct CpuList(Vec<u16>);

/// Why a `--cpu-list` value does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}: expected CPU numbers 0..={CPU_MAX} and ranges, like 0,2,4-7")]
pub struct CpuListError(String);

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<CpuList, CpuListError> {
        let bad = || CpuListError(format!("{s:?}"));
        let cpu = |t: &str| match t.trim().parse::<u16>() {
            Ok(c) if c <= CPU_MAX => Ok(c),
            _ => Err(bad()),
        };
        let mut cpus = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (cpu(lo)?, cpu(hi)?);
                    if lo > hi {
                        return Err(bad());
                    }
                    cpus.extend(lo..=hi);
                }
                None => cpus.push(cpu(part)?),
            }
        }
        let mut seen = [false; CPU_MAX as usize + 1];
        for &c in &cpus {
            if std::mem::replace(&mut seen[usize::from(c)], true) {
                return Err(CpuListError(format!("{s:?} names CPU {c} twice")));
            }
        }
        Ok(CpuList(cpus))
    }
}

impl TryFrom<String> for CpuList {
    type Error = CpuListError;

    fn try_from(s: String) -> Result<CpuList, CpuListError> {
        s.parse()
    }
}

/// Runs of consecutive CPUs print as ranges: `0-3,6`.
impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        while i < self.0.len() {
            let lo = self.0[i];
            let mut j = i;
            while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                j += 1;
            }
            if i > 0 {
                f.write_str(",")?;
            }
            match j - i {
                0 => write!(f, "{lo}")?,
                1 => write!(f, "{lo},{}", self.0[j])?,
                _ => write!(f, "{lo}-{}", self.0[j])?,
            }
            i = j + 1;
        }
        Ok(())
    }
}

impl CpuList {
    /// A list of exactly these CPUs.
    pub fn from_cpus(cpus: Vec<u16>) -> CpuList {
        CpuList(cpus)
    }

    /// The CPU shard `id` runs on.
    pub fn for_shard(&self, id: u16) -> u16 {
        self.0[usize::from(id) % self.0.len()]
    }

    /// The first CPU of the list this process may not run on, if any.
    pub fn outside(&self, allowed: &[u16]) -> Option<u16> {
        self.0.iter().copied().find(|c| !allowed.contains(c))
    }
}

/// The CPUs this process may run on (`sched_getaffinity`).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn allowed() -> std::io::Result<Vec<u16>> {
    // SAFETY: cpu_set_t is plain bits, valid when zeroed; the kernel
    // writes at most size_of::<cpu_set_t>() bytes into it; CPU_ISSET reads
    // a bit inside the set for every index below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..=CPU_MAX)
            .filter(|&c| libc::CPU_ISSET(usize::from(c), &set))
            .collect())
    }
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn pin_current_thread(cpu: u16) -> std::io::Result<()> {
    assert!(cpu <= CPU_MAX, "CPU {cpu} is beyond cpu_set_t");
    // SAFETY: as in `allowed`; CPU_SET writes the bit of a CPU below
    // CPU_SETSIZE (checked above); pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(cpu), &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Elsewhere than Linux, pinning is not supported.
#[cfg(not(target_os = "linux"))]
pub fn allowed() -> std::io::Result<Vec<u16>> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "CPU pinning is supported on Linux only",
    ))
}

/// Elsewhere than Linux, pinning is not supported.
#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(_cpu: u16) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "CPU pinning is supported on Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<u16>, CpuListError> {
        s.parse::<CpuList>().map(|l| l.0)
    }

    #[test]
    fn lists_and_ranges_parse_in_order() {
        assert_eq!(parse("0").unwrap(), [0]);
        assert_eq!(parse("3,1").unwrap(), [3, 1]);
        assert_eq!(parse("0,2,4-7").unwrap(), [0, 2, 4, 5, 6, 7]);
        assert_eq!(parse(" 1 - 2 ").unwrap(), [1, 2]);
        assert_eq!(parse("1023").unwrap(), [1023]);
        for (given, shown) in [
            ("0,2,4-5", "0,2,4,5"),
            ("0-3,6", "0-3,6"),
            ("3,1", "3,1"),
            ("5-7,0-1", "5-7,0,1"),
        ] {
            assert_eq!(given.parse::<CpuList>().unwrap().to_string(), shown);
        }
    }

    #[test]
    fn bad_lists_are_refused_with_the_value() {
        for bad in [
            "", "a", "1,", ",1", "-1", "3-1", "1024", "0-1024", "1-2-3", "1,1", "0-2,2",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(parse("1,1")
            .unwrap_err()
            .to_string()
            .contains("CPU 1 twice"));
    }

    #[test]
    fn shards_wrap_around_the_list_and_outside_finds_the_first_stranger() {
        let l: CpuList = "4,6".parse().unwrap();
        let placed: Vec<u16> = (0..5).map(|i| l.for_shard(i)).collect();
        assert_eq!(placed, [4, 6, 4, 6, 4]);
        assert_eq!(l.outside(&[4, 5, 6]), None);
        assert_eq!(l.outside(&[4]), Some(6));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_runs_only_there() {
        let allowed = allowed().unwrap();
        assert!(!allowed.is_empty());
        let cpu = *allowed.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            super::allowed().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(seen, [cpu]);
        // The spawning thread is untouched.
        assert_eq!(super::allowed().unwrap(), allowed);
    }
}
