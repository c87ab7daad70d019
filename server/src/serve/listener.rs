//! The accept loop. `axum::serve` gives hyper no timer, so hyper's header-read timeout never
//! fires (slowloris: a client sending its headers one byte at a time holds a connection for
//! ever); here each connection is served by hyper's HTTP/1 builder with tokio's timer, at most
//! `max_connections` at a time, over TLS when configured.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower_service::Service;

/// What every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections served at once; further ones wait in the kernel's accept queue.
    pub max_connections: usize,
    /// Time to receive a request's headers (and, with TLS, to finish the handshake), counted
    /// from the first byte awaited, idle keep-alive time included.
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for open connections to
/// finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: a busy loop would not cure it, a pause may.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (app, tls, http, watcher) =
            (app.clone(), tls.clone(), http.clone(), graceful.watcher());
        tokio::spawn(async move {
            let _permit = permit;
            connection(stream, peer, app, tls, http, watcher, limits.header_timeout).await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    tls: Option<TlsAcceptor>,
    http: http1::Builder,
    watcher: Watcher,
    handshake_timeout: Duration,
) {
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return http_connection(stream, peer, app, http, watcher).await;
    };
    let handshake = async {
        if !super::tls::is_tls(&mut stream).await? {
            return Ok(None);
        }
        tls.accept(stream).await.map(Some)
    };
    match tokio::time::timeout(handshake_timeout, handshake).await {
        Ok(Ok(Some(stream))) => http_connection(stream, peer, app, http, watcher).await,
        Ok(Ok(None)) => tracing::info!("{peer}: plain HTTP on the TLS port, told to use https"),
        Ok(Err(e)) => tracing::info!("{peer}: TLS handshake failed: {e}"),
        Err(_) => tracing::info!("{peer}: no TLS handshake within {handshake_timeout:?}"),
    }
}

async fn http_connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    http: http1::Builder,
    watcher: Watcher,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The client's address, for the per-IP rate limit and the log (as axum's ConnectInfo).
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().call(request)
    });
    let conn = http.serve_connection(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(conn).await {
        // Timeouts, resets and malformed requests: the client's trouble, not the server's.
        tracing::debug!("{peer}: connection ended: {e}");
    }
}
