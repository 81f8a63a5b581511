//! TLS over another step, with rustls.

use std::io;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::accept::{Accept, Accepted, Connecting};
use crate::tcp::TcpAcceptor;

/// TLS (rustls) over another step: the inner step sets the socket up
/// (plain TCP by default), then the TLS handshake runs over its I/O, and
/// the connection is served over the TLS stream. The negotiated ALPN
/// protocol is kept in the [`Accepted`] it gives back.
///
/// The handshake runs, with the inner step, under the header timeout and
/// is given up at shutdown (see [`Accept`]'s behavior); one that fails
/// closes the connection. [`Gateway::tls`](crate::Gateway::tls) installs
/// one over the gateway's step.
///
/// The configuration's ALPN list is the caller's: HTTP/2 is served on a
/// connection that negotiated `h2` (when
/// [`Http2Limits::enabled`](crate::Http2Limits)), HTTP/1.1 on any other.
#[derive(Clone)]
pub struct RustlsAcceptor<A = TcpAcceptor> {
    inner: A,
    tls: tokio_rustls::TlsAcceptor,
}

impl RustlsAcceptor {
    /// TLS with `config` over plain TCP ([`TcpAcceptor::new`]).
    pub fn new(config: Arc<rustls::ServerConfig>) -> RustlsAcceptor {
        RustlsAcceptor::over(TcpAcceptor::new(), config)
    }
}

impl<A> RustlsAcceptor<A> {
    /// TLS with `config` over `inner`'s I/O.
    pub fn over(inner: A, config: Arc<rustls::ServerConfig>) -> RustlsAcceptor<A> {
        RustlsAcceptor {
            inner,
            tls: tokio_rustls::TlsAcceptor::from(config),
        }
    }

    /// The TLS configuration.
    pub fn config(&self) -> &Arc<rustls::ServerConfig> {
        self.tls.config()
    }

    /// The inner step, to look at.
    pub fn get_ref(&self) -> &A {
        &self.inner
    }

    /// The inner step, to change.
    pub fn get_mut(&mut self) -> &mut A {
        &mut self.inner
    }

    /// The inner step, without TLS.
    pub fn into_inner(self) -> A {
        self.inner
    }
}

impl<A: std::fmt::Debug> std::fmt::Debug for RustlsAcceptor<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RustlsAcceptor")
            .field("inner", &self.inner)
            .field("alpn_protocols", &self.config().alpn_protocols)
            .finish_non_exhaustive()
    }
}

impl<A: Accept> Accept for RustlsAcceptor<A> {
    type Io = TlsStream<A::Io>;

    async fn accept(
        &self,
        stream: TcpStream,
        conn: &Connecting,
    ) -> io::Result<Accepted<TlsStream<A::Io>>> {
        let inner = self.inner.accept(stream, conn).await?;
        let tls = self.tls.accept(inner.into_inner()).await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let accepted = Accepted::new(tls);
        Ok(match alpn {
            Some(protocol) => accepted.with_alpn_protocol(protocol),
            None => accepted,
        })
    }

    fn is_tls(&self) -> bool {
        true
    }
}
