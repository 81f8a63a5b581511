//! Test support: a Redis Cluster of its own, from `redis-server
//! --cluster-enabled yes` on free local ports, formed with `redis-cli
//! --cluster create`, torn down when dropped (or when the test process
//! ends, however it ends).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster node timeout the tests run with: a dead master is noticed
/// and replaced within a few of these.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a test waits for a cluster to settle (formed, or failed over):
/// a failover takes a few node timeouts alone, but the lib's cluster tests
/// run their clusters side by side on a small machine, and one failover
/// there once took over 30 s. Polled, not slept: a settled cluster
/// returns at once.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(90);

/// A cluster of `redis-server` processes on 127.0.0.1.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    /// What `redis-cli` needs to reach the nodes (TLS options, or none).
    cli_options: Vec<String>,
}

/// Certificate files for a cluster that speaks only TLS, to clients and
/// between its nodes.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    /// The nodes' certificate (PEM); it must name 127.0.0.1.
    pub cert: std::path::PathBuf,
    /// Its key (PEM).
    pub key: std::path::PathBuf,
    /// The CA that signed it (PEM).
    pub ca: std::path::PathBuf,
}

/// One `redis-server`, run by a small shell that kills it when the test
/// process closes the shell's standard input (on drop, or by exiting).
#[derive(Debug)]
struct ClusterNode {
    port: u16,
    pid: u32,
    shell: Child,
    /// Closing it ends the node.
    lifeline: Option<ChildStdin>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits
    /// until the cluster is ready (every slot served, every replica in
    /// sync). `None`, after printing why, when `redis-server` or
    /// `redis-cli` cannot be run here; under CI (`CI` set) that panics
    /// instead: CI may not skip.
    ///
    /// # Panics
    /// If the cluster does not form.
    pub fn start(masters: usize, replicas: usize) -> Option<RedisCluster> {
        RedisCluster::start_with(masters, replicas, None)
    }

    /// As [`start`](Self::start), but every node speaks only TLS, with the
    /// certificate given (clients are not asked for certificates). Its URL
    /// is `rediss-cluster://`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_tls(masters: usize, replicas: usize, tls: &ClusterTls) -> Option<RedisCluster> {
        RedisCluster::start_with(masters, replicas, Some(tls))
    }

    fn start_with(
        masters: usize,
        replicas: usize,
        tls: Option<&ClusterTls>,
    ) -> Option<RedisCluster> {
        for tool in ["redis-server", "redis-cli"] {
            if Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_err()
            {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "{tool} must be installed under CI: the Redis Cluster tests may not skip there"
                );
                eprintln!("skipped: {tool} cannot be run here (no Redis Cluster to test against)");
                return None;
            }
        }
        let count = masters * (1 + replicas);
        let nodes: Vec<ClusterNode> = (0..count).map(|_| ClusterNode::start(tls)).collect();
        let cli_options = match tls {
            None => Vec::new(),
            Some(tls) => vec![
                "--tls".to_owned(),
                "--cacert".to_owned(),
                tls.ca.display().to_string(),
            ],
        };
        let cluster = RedisCluster { nodes, cli_options };
        for node in &cluster.nodes {
            node.wait_accepting();
        }
        let mut create = Command::new("redis-cli");
        create
            .args(&cluster.cli_options)
            .arg("--cluster")
            .arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("redis-cli --cluster create: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_ready(SETTLE_LIMIT);
        Some(cluster)
    }

    /// The store URL: `redis-cluster://` and every node.
    pub fn url(&self) -> String {
        self.url_as("")
    }

    /// The store URL with `user_info` (`USER:PASSWORD@`) in front of the
    /// nodes.
    pub fn url_as(&self, user_info: &str) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let scheme = if self.cli_options.is_empty() {
            "redis-cluster"
        } else {
            "rediss-cluster"
        };
        format!("{scheme}://{user_info}{}", nodes.join(","))
    }

    /// Every node's port.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns what it printed.
    ///
    /// # Panics
    /// If `redis-cli` cannot be run.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(&self.cli_options)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command on every node that is still running.
    pub fn on_every_node(&self, args: &[&str]) {
        for node in self.nodes.iter().filter(|n| n.lifeline.is_some()) {
            self.cli(node.port, args);
        }
    }

    /// The port of the master that serves `key` now (asked of a running
    /// node), and the ports of its replicas.
    ///
    /// # Panics
    /// If no running node answers.
    pub fn master_of(&self, key: &str) -> (u16, Vec<u16>) {
        let asker = self.running_port();
        let slot: u16 = self
            .cli(asker, &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT: {e}"));
        // Lines: id addr@bus flags master ping pong epoch state slots...
        let nodes = self.cli(asker, &["CLUSTER", "NODES"]);
        let port_of = |addr: &str| -> u16 {
            addr.split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0)
        };
        let lines: Vec<Vec<&str>> = nodes
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let master = lines
            .iter()
            .find(|f| {
                f.get(2).is_some_and(|flags| flags.contains("master"))
                    && !f.get(2).is_some_and(|flags| flags.contains("fail"))
                    && f.iter().skip(8).any(|range| serves(range, slot))
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}:\n{nodes}"));
        let replicas = lines
            .iter()
            .filter(|f| f.get(3) == master.first())
            .filter_map(|f| f.get(1).map(|a| port_of(a)))
            .collect();
        (port_of(master[1]), replicas)
    }

    fn running_port(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.lifeline.is_some())
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no node of the cluster is running"))
    }

    /// Kills the node on `port` with SIGKILL, and waits for it to go.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.signal("KILL");
            node.stop();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the node on `port`.
    pub fn signal(&self, port: u16, signal: &str) {
        if let Some(node) = self.nodes.iter().find(|n| n.port == port) {
            node.signal(signal);
        }
    }

    /// Waits until every running node reports `cluster_state:ok` and
    /// every running replica's link to its master is up.
    ///
    /// # Panics
    /// If that does not happen within `limit`.
    pub fn wait_ready(&self, limit: Duration) {
        self.wait_for(limit, "every slot served and every replica in sync", |c| {
            c.nodes.iter().filter(|n| n.lifeline.is_some()).all(|n| {
                let info = c.cli(n.port, &["CLUSTER", "INFO"]);
                let replication = c.cli(n.port, &["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            })
        });
    }

    /// Polls `ready` (every 50 ms) until it holds.
    ///
    /// # Panics
    /// If it does not within `limit`.
    pub fn wait_for(&self, limit: Duration, what: &str, ready: impl Fn(&RedisCluster) -> bool) {
        let start = Instant::now();
        while !ready(self) {
            assert!(
                start.elapsed() < limit,
                "the Redis Cluster did not get to: {what} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether a `CLUSTER NODES` slot field (`N` or `A-B`) holds `slot`.
fn serves(range: &str, slot: u16) -> bool {
    let (a, b) = range.split_once('-').unwrap_or((range, range));
    matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
}

impl ClusterNode {
    fn start(tls: Option<&ClusterTls>) -> ClusterNode {
        let port = cluster_port();
        let listen: Vec<String> = match tls {
            None => vec!["--port".into(), port.to_string()],
            Some(tls) => [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
                "--tls-cert-file",
                &tls.cert.display().to_string(),
                "--tls-key-file",
                &tls.key.display().to_string(),
                "--tls-ca-cert-file",
                &tls.ca.display().to_string(),
                "--tls-auth-clients",
                "no",
            ]
            .map(String::from)
            .to_vec(),
        };
        let dir = tempfile::Builder::new()
            .prefix("idem-redis-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir: {e}"))
            .keep();
        // The shell starts the server, says its pid, and kills it when its
        // standard input closes: on drop, or when the test process ends,
        // however it ends.
        let script = r#"redis-server "$@" >/dev/null 2>&1 & pid=$!
echo "$pid"
read -r _
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$IDEM_NODE_DIR""#;
        let node_timeout = NODE_TIMEOUT.as_millis().to_string();
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("redis-cluster-node")
            .args(&listen)
            .args([
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &node_timeout,
                // A replica may take over however long its link was down:
                // the failover tests cut it on purpose.
                "--cluster-replica-validity-factor",
                "0",
                "--dir",
                &dir.display().to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .env("IDEM_NODE_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("sh: {e}"));
        let lifeline = shell.stdin.take();
        let mut line = String::new();
        if let Some(out) = shell.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let pid = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("redis-server did not start: {line:?}"));
        ClusterNode {
            port,
            pid,
            shell,
            lifeline,
        }
    }

    fn wait_accepting(&self) {
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .stderr(Stdio::null())
            .status();
    }

    /// Closes the lifeline and waits for the shell (and so the server).
    fn stop(&mut self) {
        if self.lifeline.take().is_some() {
            let _ = self.shell.wait();
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        // A stopped server must run again to die of the signal the shell
        // sends it.
        self.signal("CONT");
        self.stop();
    }
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = crate::private_redis::free_port();
        if std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}
