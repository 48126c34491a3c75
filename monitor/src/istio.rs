//! Ending an Istio sidecar when the VM is gone, as KubeVirt's monitor does
//! (`cmd/virt-launcher-monitor`, v1.9.0): when `localhost:15021/healthz/ready` answers with a
//! `Server` header containing `envoy`, POST `localhost:15020/quitquitquit`, so the pod can
//! complete. A plain HTTP/1.1 exchange over `std::net`, with short timeouts; every failure just
//! means "no proxy".
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Envoy's health-check port (Istio's `EnvoyHealthCheckPort`).
pub const ENVOY_HEALTH_PORT: u16 = 15021;
/// Istio's merged telemetry port, which serves `/quitquitquit`.
pub const ISTIO_QUIT_PORT: u16 = 15020;

/// Where the proxy is looked for and told to quit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IstioProxy {
    /// Address of `/healthz/ready`.
    pub health: SocketAddr,
    /// Address of `/quitquitquit`.
    pub quit: SocketAddr,
}

impl Default for IstioProxy {
    fn default() -> Self {
        Self {
            health: SocketAddr::from(([127, 0, 0, 1], ENVOY_HEALTH_PORT)),
            quit: SocketAddr::from(([127, 0, 0, 1], ISTIO_QUIT_PORT)),
        }
    }
}

/// One HTTP/1.1 request without body; returns the status code and the headers (names in lower
/// case) of the answer.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request_head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        addr.port()
    );
    stream.write_all(request_head.as_bytes())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no status line"))?;
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers))
}

/// Asks the Istio proxy to quit when one answers; returns whether the quit request was accepted
/// (a 2xx answer). `timeout` bounds each connect, read and write.
pub fn quit_istio_proxy(proxy: &IstioProxy, timeout: Duration) -> bool {
    let Ok((_, headers)) = request(proxy.health, "GET", "/healthz/ready", timeout) else {
        return false;
    };
    let envoy = headers
        .iter()
        .any(|(k, v)| k == "server" && v.contains("envoy"));
    if !envoy {
        return false;
    }
    matches!(
        request(proxy.quit, "POST", "/quitquitquit", timeout),
        Ok((200..=299, _))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// Serves one connection with `answer`, sending the request's first line on the channel.
    fn serve_once(answer: &'static str) -> (SocketAddr, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            if let Ok((mut conn, _)) = listener.accept() {
                let mut buf = [0u8; 1024];
                let n = conn.read(&mut buf).unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..n]).to_string();
                let _ = tx.send(text.lines().next().unwrap_or_default().to_string());
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        (addr, rx)
    }

    const ENVOY: &str = "HTTP/1.1 200 OK\r\nserver: envoy\r\ncontent-length: 0\r\n\r\n";
    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

    #[test]
    fn envoy_is_told_to_quit() {
        let (health, health_req) = serve_once(ENVOY);
        let (quit, quit_req) = serve_once(OK);
        let proxy = IstioProxy { health, quit };
        assert!(quit_istio_proxy(&proxy, Duration::from_secs(2)));
        assert_eq!(health_req.recv().unwrap(), "GET /healthz/ready HTTP/1.1");
        assert_eq!(quit_req.recv().unwrap(), "POST /quitquitquit HTTP/1.1");
    }

    #[test]
    fn another_server_is_left_alone() {
        let (health, _) = serve_once("HTTP/1.1 200 OK\r\nServer: nginx\r\n\r\n");
        let (quit, quit_req) = serve_once(OK);
        assert!(!quit_istio_proxy(
            &IstioProxy { health, quit },
            Duration::from_secs(2)
        ));
        assert!(quit_req.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn nothing_listening_means_no_proxy() {
        // Bind and drop to get a port nobody listens on.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = IstioProxy {
            health: addr,
            quit: addr,
        };
        assert!(!quit_istio_proxy(&proxy, Duration::from_millis(500)));
    }
}
