//! A loopback TCP relay in front of a server, to make it unreachable and
//! reachable again on demand (a backend down at start, a connection lost).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

/// A loopback TCP relay to `target`; while down, it drops the connections
/// it relays and every new one (the client sees its request fail).
pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(watch::channel(false).0);
        let sender = down.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *sender.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut down = sender.subscribe();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = down.wait_for(|down| *down) => {}
                        }
                    }
                });
            }
        });
        Self { addr, down, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
