//! An HTTP client per thread. A pooled connection of reqwest (hyper-util)
//! is driven by a task on the runtime that opened it, so one client shared
//! by the node's connection threads (`serve::threads`) would hand a call to
//! whichever thread opened its connection, and wake it there; a client per
//! thread keeps a call's I/O on the thread that serves the request.
//! `thread_local::ThreadLocal` (already in the tree through
//! tracing-subscriber) gives one per thread and per owner, unlike `std`'s
//! `thread_local!`, which is one per thread for the whole process.

use thread_local::ThreadLocal;

pub struct ClientPerThread {
    clients: ThreadLocal<reqwest::Client>,
    make: Box<dyn Fn() -> reqwest::Result<reqwest::Client> + Send + Sync>,
}

impl ClientPerThread {
    /// Clients made by `make`, one on each thread that asks. `make` runs
    /// once here, so a builder that cannot work fails at start.
    pub fn new(
        make: impl Fn() -> reqwest::Result<reqwest::Client> + Send + Sync + 'static,
    ) -> reqwest::Result<Self> {
        let clients = ThreadLocal::new();
        clients.get_or_try(&make)?;
        Ok(Self {
            clients,
            make: Box::new(make),
        })
    }

    /// This thread's client (a cheap handle onto its pool).
    pub fn here(&self) -> reqwest::Result<reqwest::Client> {
        self.clients.get_or_try(&self.make).cloned()
    }
}
