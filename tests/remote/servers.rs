//! Burn remote servers for the tests, each a process of this test binary (`--serve PORT`)
//! in a network namespace of its own, reached over a veth pair at its own address.

// The tests use some of this, `benches/remote_step` the rest.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::Device;

/// The port every server listens on (each has an address of its own).
const PORT: u16 = 3000;
/// How long a server may take to open its port.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Serves Flex on `port` until the process is killed: the `--serve` mode of the binary.
pub fn serve(port: u16) {
    burn::server::RemoteServer::new([Device::flex()])
        .serve(burn::server::WebSocketTransport::new(port))
        .expect("the server serves");
}

/// One server: its namespace, its link and its process; all removed when dropped.
pub struct Server {
    namespace: String,
    /// This side of the server's veth pair, and the server's side.
    link: String,
    peer: String,
    process: Child,
    /// `HOST:PORT` of the server.
    pub address: String,
}

/// Servers started so far by this process: each gets a namespace and a subnet of its own.
static STARTED: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip` with `args`.
///
/// # Panics
///
/// When it fails, with what to do where the tests cannot make namespaces.
fn ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|error| panic!("`ip {}`: {error} (needs iproute2)", args.join(" ")));
    assert!(
        status.success(),
        "`ip {}` failed: the remote tests make network namespaces, which needs root \
         (CAP_NET_ADMIN)",
        args.join(" ")
    );
}

impl Server {
    /// Starts a server in a fresh namespace and waits (at most [`START_LIMIT`]) for its port.
    pub fn start() -> Self {
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() % 100_000;
        let namespace = format!("dp{pid}s{n}");
        let (link, peer) = (format!("dp{pid}h{n}"), format!("dp{pid}n{n}"));
        // A /24 per server in 198.18.0.0/15, the block set aside for network tests
        // (RFC 2544), from the process and the server.
        let block = (pid as usize * 7 + n) % 512;
        let subnet = format!("198.{}.{}", 18 + block / 256, block % 256);
        ip(&["netns", "add", &namespace]);
        let mut server = Server {
            namespace: namespace.clone(),
            link: link.clone(),
            peer: peer.clone(),
            process: Command::new("true").spawn().expect("a process"),
            address: format!("{subnet}.2:{PORT}"),
        };
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &namespace]);
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &namespace, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{subnet}.2/24"), "dev", &peer]);
        inside(&["link", "set", &peer, "up"]);
        inside(&["link", "set", "lo", "up"]);
        let exe = std::env::current_exe().expect("the test binary");
        // `ip netns exec` execs the binary: the child is the server itself.
        server.process = Command::new("ip")
            .args(["netns", "exec", &namespace])
            .arg(exe)
            .args(["--serve", &PORT.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts");
        let socket: SocketAddr = server.address.parse().expect("an address");
        let deadline = Instant::now() + START_LIMIT;
        while TcpStream::connect_timeout(&socket, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the server at {} did not open its port within {START_LIMIT:?}",
                server.address
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// The server's `DeviceList` entry.
    pub fn entry(&self) -> String {
        format!("ws://{}", self.address)
    }

    /// Limits the link to `rate` (`tc`'s form: `1gbit`) each way, with a token bucket on
    /// both ends.
    pub fn limit_rate(&self, rate: &str) {
        let tbf = [
            "root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms",
        ];
        let status = Command::new("tc")
            .args(["qdisc", "add", "dev", &self.link])
            .args(tbf)
            .status()
            .expect("tc (iproute2)");
        assert!(status.success(), "tc on {}", self.link);
        let status = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.namespace,
                "tc",
                "qdisc",
                "add",
                "dev",
                &self.peer,
            ])
            .args(tbf)
            .status()
            .expect("tc (iproute2)");
        assert!(status.success(), "tc on {}", self.peer);
    }

    /// Bytes sent to the server and received from it so far (its link's counters, this
    /// side).
    pub fn bytes(&self) -> (u64, u64) {
        let read = |name: &str| {
            let path = format!("/sys/class/net/{}/statistics/{name}", self.link);
            std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0)
        };
        (read("tx_bytes"), read("rx_bytes"))
    }

    /// Kills the server's process (a machine that went away); its namespace stays.
    pub fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        // Deleting the namespace deletes its end of the pair, and with it this one.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .stderr(Stdio::null())
            .status();
    }
}
