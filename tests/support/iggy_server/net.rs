//! The server thread: its own tokio runtime, the accept loop, one task per
//! connection (plain TCP, or TLS when the server has an acceptor), and the
//! control channel the handle uses to drop connections or stop and resume
//! listening.

use super::commands::{self, Outcome, Session};
use super::faults::Faults;
use super::state::State;
use super::wire;
use bytes::BytesMut;
use iggy_binary_protocol::consensus::HEADER_SIZE;
use std::io;
use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// Requests from the handle to the server thread. Acknowledged ones are
/// answered once the work is done, so the handle can return synchronously.
pub(crate) enum Control {
    /// Close every open connection.
    DropConnections(std_mpsc::Sender<()>),
    /// Close the listener and every open connection.
    StopListening(std_mpsc::Sender<()>),
    /// Serve this (already bound) listener.
    Listen(std::net::TcpListener, std_mpsc::Sender<()>),
    Shutdown,
}

/// What the handle and the connection tasks share.
pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) faults: Arc<Faults>,
}

impl Shared {
    pub(crate) fn new(state: State, faults: Arc<Faults>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(state),
            faults,
        })
    }

    /// Locks the state. A handler that panicked leaves it usable.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts the server thread serving `listener`, over TLS when `tls` is set.
pub(crate) fn spawn(
    listener: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    control: mpsc::UnboundedReceiver<Control>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("iggy-test-server".to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the test server runtime starts");
            runtime.block_on(run(listener, tls, shared, control));
        })
        .expect("the test server thread starts")
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn run(
    listener: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut listener = Some(TcpListener::from_std(listener).expect("the listener is non-blocking"));
    let kill = watch::Sender::new(0u64);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve(stream, tls.clone(), Arc::clone(&shared), kill.subscribe()));
                }
                // Out of descriptors or a reset before accept: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            message = control.recv() => match message {
                None | Some(Control::Shutdown) => break,
                Some(Control::DropConnections(ack)) => {
                    close_all(&kill, &mut connections).await;
                    let _ = ack.send(());
                }
                Some(Control::StopListening(ack)) => {
                    listener = None;
                    shared.state().restarting = true;
                    close_all(&kill, &mut connections).await;
                    shared.state().restarting = false;
                    let _ = ack.send(());
                }
                Some(Control::Listen(std_listener, ack)) => {
                    listener = Some(
                        TcpListener::from_std(std_listener).expect("the listener is non-blocking"),
                    );
                    let _ = ack.send(());
                }
            },
        }
    }
    connections.shutdown().await;
}

/// Closes every connection and waits until each has cleaned up.
async fn close_all(kill: &watch::Sender<u64>, connections: &mut JoinSet<()>) {
    kill.send_modify(|epoch| *epoch += 1);
    while connections.join_next().await.is_some() {}
}

async fn serve(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut kill: watch::Receiver<u64>,
) {
    shared.state().open_connections += 1;
    let mut session = Session::default();
    let mut stall = shared.faults.stall_receiver();
    // The handshake runs inside the select too, so a client stuck in it is
    // closed by `drop_connections` and `restart` like any other.
    let served = async {
        match tls {
            None => exchange(stream, &shared, &mut session, &mut stall).await,
            Some(acceptor) => {
                let stream = acceptor.accept(stream).await?;
                exchange(stream, &shared, &mut session, &mut stall).await
            }
        }
    };
    tokio::select! {
        _ = served => {}
        _ = kill.changed() => {}
    }
    let mut state = shared.state();
    session.end(&mut state);
    state.open_connections -= 1;
}

/// The lockstep request/reply loop of one connection.
async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    shared: &Shared,
    session: &mut Session,
    stall: &mut watch::Receiver<Option<Duration>>,
) -> io::Result<()> {
    // Writes pass through the buffered reader to the stream.
    let mut stream = BufReader::with_capacity(64 * 1024, stream);
    loop {
        let mut header_bytes = [0u8; HEADER_SIZE];
        stream.read_exact(&mut header_bytes).await?;
        let Some(header) = wire::decode_request_header(&header_bytes) else {
            return Ok(());
        };
        let mut body = BytesMut::zeroed(header.size as usize - HEADER_SIZE);
        stream.read_exact(&mut body).await?;
        let outcome = {
            let mut state = shared.state();
            commands::handle(&mut state, &shared.faults, session, &header, body)
        };
        let Outcome::Send(frame) = outcome else {
            return Ok(());
        };
        hold(stall).await;
        stream.write_all(&frame).await?;
        // A TLS stream may hold the last record until flushed.
        stream.flush().await?;
    }
}

/// Waits out a reply stall, or until the stall is cleared.
async fn hold(stall: &mut watch::Receiver<Option<Duration>>) {
    let Some(duration) = *stall.borrow_and_update() else {
        return;
    };
    let deadline = Instant::now() + duration;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return,
            changed = stall.changed() => {
                if changed.is_err() || stall.borrow_and_update().is_none() {
                    return;
                }
            }
        }
    }
}
