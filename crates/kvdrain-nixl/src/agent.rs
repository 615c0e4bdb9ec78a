//! A NIXL agent with one UCX backend and its DRAM registrations.
//!
//! [`UcxAgent`] owns, in drop order: every DRAM registration, the UCX backend handle, the
//! agent. In-flight `nixl_sys::XferRequest`s are **not** owned here; whoever owns them must
//! drop them (after a terminal status) before dropping the `UcxAgent`, as registrations must
//! outlive every request that uses them.

use nixl_sys::{
    Agent, AgentConfig, Backend, MemType, MemoryRegion, NixlDescriptor, NixlError, NotificationMap,
    RegistrationHandle,
};

use crate::loader::{NixlLoadError, ensure_nixl};

/// Name of the NIXL UCX backend plugin.
pub const UCX_PLUGIN: &str = "UCX";

/// A host-memory (DRAM) range owned by someone else (e.g. engine KV blocks or a test buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DramRegion {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

impl DramRegion {
    /// A region of `len` bytes at `addr`.
    pub const fn new(addr: usize, len: usize) -> Self {
        Self { addr, len }
    }

    /// The memory of `slice`. Use interior-mutable element types (`AtomicU8`, `Cell`, ...) for
    /// memory that remote peers will write, so reading it later from Rust stays sound.
    pub fn of_slice<T>(slice: &[T]) -> Self {
        Self::new(slice.as_ptr() as usize, std::mem::size_of_val(slice))
    }

    /// One past the last byte.
    pub const fn end(&self) -> usize {
        self.addr + self.len
    }
}

impl MemoryRegion for DramRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for DramRegion {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// Failure of an [`UcxAgent`] operation.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The NIXL runtime is not available (nothing was called on `nixl-sys`).
    #[error(transparent)]
    Load(#[from] NixlLoadError),
    /// A `nixl-sys` call failed.
    #[error("NIXL {op} failed for agent {agent:?}: {source}")]
    Nixl {
        /// The agent's name.
        agent: String,
        /// The operation, e.g. `"create_backend(UCX)"`.
        op: &'static str,
        /// The `nixl-sys` error.
        #[source]
        source: NixlError,
    },
}

/// A NIXL agent with a UCX backend and the DRAM regions registered through it.
#[derive(Debug)]
pub struct UcxAgent {
    // Field order is drop order: registrations first, then the backend handle, then the agent
    // (whose drop invalidates remotes and destroys the backends).
    registrations: Vec<(DramRegion, RegistrationHandle)>,
    backend: Backend,
    agent: Agent,
    name: String,
}

impl UcxAgent {
    /// Loads NIXL if needed ([`ensure_nixl`]), creates agent `name` (progress thread on) and a
    /// UCX backend with the plugin's default parameters.
    ///
    /// `name` must be unique among every agent this one talks to: receivers identify senders
    /// only by it.
    pub fn new(name: &str) -> Result<Self, AgentError> {
        Self::with_ucx_params(name, &[])
    }

    /// Like [`UcxAgent::new`], overriding UCX backend parameters (e.g. `("num_workers", "2")`,
    /// `("ucx_error_handling_mode", "none")`) on top of the plugin's defaults.
    pub fn with_ucx_params(name: &str, overrides: &[(&str, &str)]) -> Result<Self, AgentError> {
        Self::with_config(name, &AgentConfig::default(), overrides)
    }

    /// Like [`UcxAgent::with_ucx_params`], with explicit agent settings. With
    /// `enable_prog_thread: false` nothing progresses between calls: whoever owns the agent
    /// must keep polling (`get_notifications`, `get_xfer_status`), which the pump and the
    /// pusher do anyway; it saves a spinning thread per agent.
    pub fn with_config(
        name: &str,
        config: &AgentConfig,
        overrides: &[(&str, &str)],
    ) -> Result<Self, AgentError> {
        ensure_nixl()?;
        let err = |op: &'static str| {
            let agent = name.to_owned();
            move |source| AgentError::Nixl { agent, op, source }
        };
        let agent = Agent::new_configured(name, config).map_err(err("Agent::new_configured"))?;
        let (_mems, mut params) = agent
            .get_plugin_params(UCX_PLUGIN)
            .map_err(err("get_plugin_params(UCX)"))?;
        for (k, v) in overrides {
            params.set(k, v).map_err(err("Params::set"))?;
        }
        let backend = agent
            .create_backend(UCX_PLUGIN, &params)
            .map_err(err("create_backend(UCX)"))?;
        Ok(Self {
            registrations: Vec::new(),
            backend,
            agent,
            name: name.to_owned(),
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The underlying `nixl-sys` agent (clones share the same C++ agent).
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The UCX backend handle.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Registers `region` with the UCX backend; the registration lives until `self` is dropped.
    ///
    /// Contract (not checkable here): the memory must stay allocated, and must not be
    /// read or written through Rust references that assume no one else writes it, for as long
    /// as this agent lives and any transfer may touch it. Remote peers can write it at any time
    /// once they hold this agent's metadata.
    pub fn register_dram(&mut self, region: DramRegion) -> Result<(), AgentError> {
        let handle = self
            .agent
            .register_memory(&region, None)
            .map_err(|source| self.nixl_err("register_memory", source))?;
        self.registrations.push((region, handle));
        Ok(())
    }

    /// The registered regions, in registration order.
    pub fn registered(&self) -> impl ExactSizeIterator<Item = DramRegion> + '_ {
        self.registrations.iter().map(|(r, _)| *r)
    }

    /// This agent's metadata (publish it to initiators; call after registering).
    pub fn local_metadata(&self) -> Result<Vec<u8>, AgentError> {
        self.agent
            .get_local_md()
            .map_err(|source| self.nixl_err("get_local_md", source))
    }

    /// Loads a remote agent's metadata; returns the remote agent's name.
    pub fn load_remote_metadata(&self, metadata: &[u8]) -> Result<String, AgentError> {
        self.agent
            .load_remote_md(metadata)
            .map_err(|source| self.nixl_err("load_remote_md", source))
    }

    /// Drains every notification received since the previous call, as `(sender agent name, raw
    /// bytes)`, in arrival order per sender (no order across senders).
    ///
    /// Uses a fresh `NotificationMap` per call and reads raw bytes through `agents()` /
    /// `get_notifications(agent)`: a reused map re-reports old messages, and `take_notifs`
    /// fails forever once a non-UTF-8 message arrives. Entries the map cannot hand out through
    /// the safe API (a sender name that is not UTF-8, an internal lookup error) are skipped.
    pub fn drain_notifications(&self) -> Result<Vec<(String, Vec<u8>)>, AgentError> {
        drain_notifications(&self.agent, &self.name)
    }

    fn nixl_err(&self, op: &'static str, source: NixlError) -> AgentError {
        AgentError::Nixl {
            agent: self.name.clone(),
            op,
            source,
        }
    }
}

/// [`UcxAgent::drain_notifications`] on a bare `nixl_sys::Agent` (which is `Sync`), for a
/// thread that only drains; `name` labels errors.
///
/// # Errors
/// [`AgentError`] if NIXL refused.
pub fn drain_notifications(
    agent: &Agent,
    name: &str,
) -> Result<Vec<(String, Vec<u8>)>, AgentError> {
    let err = |op: &'static str| {
        move |source| AgentError::Nixl {
            agent: name.to_owned(),
            op,
            source,
        }
    };
    let mut map = NotificationMap::new().map_err(err("NotificationMap::new"))?;
    agent
        .get_notifications(&mut map, None)
        .map_err(err("get_notifications"))?;
    let mut out = Vec::new();
    for sender in map.agents().flatten() {
        let Ok(messages) = map.get_notifications(sender) else {
            continue;
        };
        out.extend(messages.flatten().map(|m| (sender.to_owned(), m)));
    }
    Ok(out)
}
