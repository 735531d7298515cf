//! CPU accounting from Linux's /proc: the broker (`--broker-pid`), this
//! process, and a whole PostgreSQL cluster (`--postgres-pid`).

use super::summary::CpuPerJob;

/// CPU seconds (user + system) consumed so far by the broker, this process,
/// and the PostgreSQL cluster (None off Linux, or when the pid was not given).
#[derive(Clone, Copy, Debug)]
pub struct CpuTimes {
    broker: Option<f64>,
    client: Option<f64>,
    postgres: Option<f64>,
}

impl CpuTimes {
    /// Several broker or postgres pids: the sum over them (None if any
    /// cannot be read, or none was given).
    pub fn read(broker_pids: &[u32], postgres_pids: &[u32]) -> CpuTimes {
        let sum = |pids: &[u32], f: &dyn Fn(u32) -> Option<f64>| -> Option<f64> {
            if pids.is_empty() {
                return None;
            }
            pids.iter().map(|p| f(*p)).sum()
        };
        CpuTimes {
            broker: sum(broker_pids, &|p| proc_cpu(p, true)),
            client: proc_cpu(std::process::id(), false),
            postgres: sum(postgres_pids, &cluster_cpu),
        }
    }

    /// What was consumed since `before`.
    pub fn since(&self, before: &CpuTimes) -> CpuTimes {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        CpuTimes {
            broker: d(self.broker, before.broker),
            client: d(self.client, before.client),
            postgres: d(self.postgres, before.postgres),
        }
    }

    /// µs of CPU per job, for `jobs` jobs (None for none).
    pub fn per_job(&self, jobs: u64) -> CpuPerJob {
        let per = |secs: Option<f64>| {
            secs.filter(|_| jobs > 0)
                .map(|s| (s * 1e6 / jobs as f64 * 10.0).round() / 10.0)
        };
        CpuPerJob {
            broker: per(self.broker),
            client: per(self.client),
            postgres: per(self.postgres),
        }
    }
}

/// Fields of /proc/PID/stat after the command name.
fn proc_stat(pid: u32) -> Option<Vec<u64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// CPU seconds of a process; with `children`, also of its exited children.
fn proc_cpu(pid: u32, children: bool) -> Option<f64> {
    let f = proc_stat(pid)?;
    // utime, stime, cutime, cstime are fields 14-17 (11-14 after the name).
    let ticks = f.get(11)? + f.get(12)? + if children { f.get(13)? + f.get(14)? } else { 0 };
    Some(ticks as f64 / clock_ticks())
}

/// CPU seconds of a PostgreSQL cluster: its postmaster with every exited
/// child (vacuum workers, closed backends), plus its live children.
fn cluster_cpu(postmaster: u32) -> Option<f64> {
    let mut total = proc_cpu(postmaster, true)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(f) = proc_stat(pid)
            && f.get(1) == Some(&u64::from(postmaster))
        {
            total += (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) as f64 / clock_ticks();
        }
    }
    Some(total)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// This process's resident set, from /proc (0 where unavailable).
pub fn own_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The host's speed, as the CPU time this thread takes for two fixed pieces
/// of work: one in a 256 KiB buffer (the core: about 0.8 ms on this 2-core
/// VM under a soak), one chasing 50,000 dependent reads through 64 MiB
/// (memory, about 10 ms: what a neighbour's cache and memory traffic
/// slows). Each grows when the host runs slower for reasons outside the
/// processes measured: a hypervisor taking the vCPU (this machine reports
/// no steal time), a slower clock, a neighbour. Sampled beside a soak, it
/// tells a slower host from a slower broker: both show as fewer jobs per
/// second, only the host as a slower probe (docs/BENCHMARKS.md, "Three
/// soaks alone, with the host probe"). Run once a second, it adds about
/// 1 % of a core, and 64 MiB, to the load generator.
pub fn host_probe() -> Option<(std::time::Duration, std::time::Duration)> {
    use std::sync::{Mutex, OnceLock};
    static MEMORY: OnceLock<Mutex<Vec<u64>>> = OnceLock::new();
    let t0 = thread_cpu()?;
    let mut buf = vec![0u64; 32 * 1024];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..400_000usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x as usize) & (buf.len() - 1);
        buf[j] = buf[j].wrapping_add(x ^ i as u64);
    }
    std::hint::black_box(&buf);
    let t1 = thread_cpu()?;
    // Written once, outside the timing: every page is mapped.
    let memory = MEMORY.get_or_init(|| Mutex::new(vec![1u64; 8 << 20]));
    let mut memory = memory.lock().unwrap_or_else(|e| e.into_inner());
    let t2 = thread_cpu()?;
    let mask = memory.len() - 1;
    let mut j = 0usize;
    for _ in 0..50_000 {
        // The next address depends on the value just read: one read at a
        // time, so the loop measures memory latency.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = memory[j];
        memory[j] = v.wrapping_add(1);
        j = ((x ^ v) as usize) & mask;
    }
    std::hint::black_box(j);
    let t3 = thread_cpu()?;
    Some((t1.checked_sub(t0)?, t3.checked_sub(t2)?))
}

/// This thread's CPU time.
fn thread_cpu() -> Option<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}
