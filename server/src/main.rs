//! The `sluiced` binary: parse flags, start the node, run until SIGTERM or
//! Ctrl-C, drain, exit 0 (1 when the final snapshot could not be written).

use sluice_server::{Config, Server};

/// A panic anywhere ends the process, after the panic's own message: a
/// shard thread that died would leave every connection with a request
/// forwarded to it waiting for an answer that never comes, and a task that
/// died could hold a shard's state half-changed. The supervisor restarts
/// the node (from its snapshot), and with replication its follower takes
/// over meanwhile. Connections see the socket close: outcome unknown, as
/// after a kill -9.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "sluiced: a thread panicked: aborting, so that no connection waits on a dead shard"
        );
        std::process::abort();
    }));
}

/// jemalloc, not glibc's malloc: a call that waits (for a forward to
/// another node, for another shard) holds its buffers while the calls
/// behind it allocate theirs, and at 20-50 such calls glibc's per-thread
/// cache (7 blocks a size) runs dry, so most of them take its slow path
/// (an Envoy call forwarded to its owner: about 22 slow allocations,
/// 5.5k instructions more than a local one). jemalloc's thread cache
/// holds far more a size. The memory bounds hold the same
/// (tests/tests/hardening.rs); benches/notes.md has the figures.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    abort_on_panic();
    let config = match Config::load(std::env::args_os()) {
        Ok(c) => c,
        Err(sluice_server::config::LoadError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("sluiced: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr);
    match config.log_format {
        sluice_server::config::LogFormat::Json => logs.json().init(),
        // Colours only for a person at a terminal: a log file or a pipe
        // gets plain text, and NO_COLOR turns them off anywhere.
        sluice_server::config::LogFormat::Text => logs
            .with_ansi(
                std::io::IsTerminal::is_terminal(&std::io::stderr())
                    && std::env::var_os("NO_COLOR").is_none(),
            )
            .init(),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the main runtime builds");
    rt.block_on(async {
        let server = match Server::bind(config) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("sluiced: {e}");
                if let sluice_server::server::StartError::Bind { source, .. } = &e {
                    if source.kind() == std::io::ErrorKind::AddrInUse {
                        eprintln!(
                            "sluiced: is another sluiced (or another program) on that port? \
                             Stop it, or choose another with --port (0 picks a free one)"
                        );
                    }
                }
                return std::process::ExitCode::from(2);
            }
        };
        // The handlers go in before the port is announced: a script that
        // reads the line below and sends SIGTERM at once gets the drain,
        // not the default action (CI caught that race once).
        let first = next_signal();
        // Scripts and tests read this line to learn the port.
        println!(
            "sluiced listening on {} shards={}",
            server.local_addr(),
            server.shard_count()
        );
        // Only with --resp-port: a second line, so the first keeps its form.
        if let Some(resp_addr) = server.resp_addr() {
            println!("sluiced resp listening on {resp_addr}");
        }
        // Only with --admin-port: after those, a line of its own.
        if let Some(admin_addr) = server.admin_addr() {
            println!("sluiced admin listening on {admin_addr}");
        }
        // Only with --tls-port (protocol v1 over TLS).
        if let Some(tls_addr) = server.tls_addr() {
            println!("sluiced tls listening on {tls_addr}");
        }
        // Only with --rls-port (Envoy's rate limit service, gRPC).
        if let Some(rls_addr) = server.rls_addr() {
            println!("sluiced rls listening on {rls_addr}");
        }
        tracing::info!(addr = %server.local_addr(), resp_addr = ?server.resp_addr(), shards = server.shard_count(), "serving");
        let shutdown = async {
            first.await;
            // A second one does not wait for the drain. Listened for from
            // here on, before the listener closes (a script that sees the
            // port refuse knows a second signal counts).
            let second = next_signal();
            tokio::spawn(async {
                second.await;
                eprintln!("sluiced: a second signal: exiting now, without finishing the drain");
                std::process::exit(1);
            });
        };
        match server.serve(shutdown).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluiced: {e}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}

/// A future that resolves at the next SIGTERM or SIGINT from now on (the
/// handlers are in place when this returns).
fn next_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler installs");
        let mut int = signal(SignalKind::interrupt()).expect("a SIGINT handler installs");
        async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
