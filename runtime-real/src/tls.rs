//! Mutual TLS: the cluster's certificate authority, the credentials it issues, and the
//! rustls configurations every connection is made with.
//!
//! A credentials directory holds `ca.pem` (the cluster's authority), `cert.pem` and
//! `key.pem` (its holder's). A certificate names its holder in its subject's common
//! name as an `auth::Caller` label (`master:3`, `chunkserver:rack1-07`,
//! `client:alice:staff`, `admin:root`): the transport hands every request on with the
//! caller its peer's certificate names, and the state machines decide what it may do.
//!
//! Both ends prove themselves. A server asks every peer for a certificate the cluster's
//! authority signed (a connection without one is refused in the handshake); a caller
//! checks that the server's certificate is the authority's and names the kind of server
//! it means to reach ([`server_name`]: a master's certificate carries `master.tessera`
//! among its names, a chunkserver's `chunkserver.tessera`, a user's none), so neither a
//! client's certificate nor a chunkserver's can answer as a master (a heartbeat's reply
//! carries orders), nor a master's or a user's serve chunk reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tessera_core::auth::{Caller, Role, ServerRole};
use tokio_rustls::rustls;

/// The DNS name a server certificate of `role` carries, and a caller that means to reach
/// such a server checks for: node addresses are IP addresses and ports that change, so
/// what a caller verifies is that the server holds a certificate of this cluster's
/// authority for that role.
pub fn server_name(role: ServerRole) -> &'static str {
    match role {
        ServerRole::Master => "master.tessera",
        ServerRole::Chunkserver => "chunkserver.tessera",
    }
}

/// The role a server's caller serves as, if it is a server's.
fn serves_as(caller: &Caller) -> Option<ServerRole> {
    match caller.role()? {
        Role::Master => Some(ServerRole::Master),
        Role::Chunkserver => Some(ServerRole::Chunkserver),
        Role::Client | Role::Admin => None,
    }
}

/// How long an issued certificate is valid by default, and the authority's own.
pub const DEFAULT_DAYS: u32 = 365;
const CA_DAYS: u32 = 10 * 365;

const CA_FILE: &str = "ca.pem";
const CERT_FILE: &str = "cert.pem";
const KEY_FILE: &str = "key.pem";
/// In an authority's directory (made by [`init_ca`]), beside `ca.pem`.
const CA_KEY_FILE: &str = "ca-key.pem";

/// A failure to read, make or use credentials, saying which file and why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

fn err(m: impl Into<String>) -> TlsError {
    TlsError(m.into())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| err(format!("{}: {e}", path.display())))
}

/// One node's or user's credentials, loaded and checked.
#[derive(Clone)]
pub struct Credentials {
    /// Who the certificate says its holder is.
    pub caller: Caller,
    dir: PathBuf,
    ca: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    ca_pem: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        write!(
            f,
            "Credentials({} from {})",
            self.caller,
            self.dir.display()
        )
    }
}

impl Credentials {
    /// Reads `dir/ca.pem`, `dir/cert.pem` and `dir/key.pem`, and checks that the
    /// certificate names a caller and was issued by that authority.
    pub fn load(dir: &Path) -> Result<Credentials, TlsError> {
        let ca_pem = read(&dir.join(CA_FILE))?;
        let cert_pem = read(&dir.join(CERT_FILE))?;
        let key_pem = read(&dir.join(KEY_FILE))?;
        let certs = |pem: &[u8], what: &Path| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let v: Vec<_> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|e| err(format!("{}: {e}", what.display())))?;
            if v.is_empty() {
                return Err(err(format!("{}: no certificate in it", what.display())));
            }
            Ok(v)
        };
        let ca = certs(&ca_pem, &dir.join(CA_FILE))?;
        let chain = certs(&cert_pem, &dir.join(CERT_FILE))?;
        PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| err(format!("{}: {e}", dir.join(KEY_FILE).display())))?;
        let caller = caller_of(&chain[0])
            .map_err(|e| err(format!("{}: {e}", dir.join(CERT_FILE).display())))?;
        if let Some(s) = serves_as(&caller)
            && !dns_names(&chain[0]).iter().any(|n| n == server_name(s))
        {
            // Issued before certificates named the kind of server: callers would refuse it.
            return Err(err(format!(
                "{}: the certificate of {caller} does not carry the name {} its callers \
                 check for; issue it again (tessera admin certs issue)",
                dir.join(CERT_FILE).display(),
                server_name(s)
            )));
        }
        let c = Credentials {
            caller,
            dir: dir.to_path_buf(),
            ca,
            chain,
            key_pem,
            cert_pem,
            ca_pem,
        };
        // Refuse now, not at the first connection, a certificate its authority did not
        // sign (credentials of another cluster put beside this one's authority).
        c.verifier()?
            .verify_client_cert(
                &c.chain[0],
                &c.chain[1..],
                rustls_pki_types::UnixTime::now(),
            )
            .map_err(|e| {
                err(format!(
                    "{}: not valid under {}: {e}",
                    dir.join(CERT_FILE).display(),
                    dir.join(CA_FILE).display()
                ))
            })?;
        Ok(c)
    }

    /// As [`Credentials::load`], but without checking that the certificate is valid
    /// now under the authority: for tests of what a server refuses (an expired
    /// certificate, another cluster's).
    pub fn load_unverified(dir: &Path) -> Result<Credentials, TlsError> {
        let ca_pem = read(&dir.join(CA_FILE))?;
        let cert_pem = read(&dir.join(CERT_FILE))?;
        let key_pem = read(&dir.join(KEY_FILE))?;
        let parse = |pem: &[u8]| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|e| err(e.to_string()))
        };
        let chain = parse(&cert_pem)?;
        let first = chain.first().ok_or_else(|| err("no certificate"))?;
        Ok(Credentials {
            caller: caller_of(first).map_err(err)?,
            dir: dir.to_path_buf(),
            ca: parse(&ca_pem)?,
            chain,
            key_pem,
            cert_pem,
            ca_pem,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| err(format!("{}: {e}", self.dir.join(CA_FILE).display())))?;
        }
        Ok(Arc::new(roots))
    }

    fn verifier(&self) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
        rustls::server::WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(|e| err(format!("the cluster's authority: {e}")))
    }

    /// The configuration a server accepts connections with: its certificate, and a
    /// certificate from every peer, of this cluster's authority.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| err(format!("{}: {e}", self.dir.join(KEY_FILE).display())))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| err(e.to_string()))?
            .with_client_cert_verifier(self.verifier()?)
            .with_single_cert(self.chain.clone(), key)
            .map_err(|e| err(format!("{}: {e}", self.dir.join(CERT_FILE).display())))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        // The server's order of ciphers, not the caller's: AES-128-GCM first (`provider`).
        cfg.ignore_client_order = true;
        Ok(Arc::new(cfg))
    }

    /// The configuration calls to a `server` are made with (tonic's, on rustls): this
    /// holder's certificate, and a certificate of this cluster's authority for that kind
    /// of server.
    pub fn client_config(&self, server: ServerRole) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .domain_name(server_name(server))
    }
}

/// ring's ciphers, AES-128-GCM first: a chunk's bytes are encrypted once by the server
/// and decrypted once by the caller, and at loopback or 10 GbE rates that is much of a
/// core; AES-128-GCM does about a fifth more per core than AES-256-GCM on this kind of
/// machine (4.1 against 3.4 GB/s) for a margin no attack on a 128-bit key needs.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        use rustls::CipherSuite::*;
        match s.suite() {
            TLS13_AES_128_GCM_SHA256 => 0,
            TLS13_AES_256_GCM_SHA384 => 1,
            _ => 2,
        }
    });
    Arc::new(p)
}

/// The caller a certificate names (its subject's common name, an `auth::Caller` label).
pub fn caller_of(cert: &CertificateDer<'_>) -> Result<Caller, String> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("not a certificate: {e}"))?;
    let cn = c
        .subject()
        .iter_common_name()
        .next()
        .ok_or("the certificate names nobody (no common name)")?
        .as_str()
        .map_err(|e| format!("its common name is not text: {e}"))?;
    match Caller::parse(cn)? {
        Caller::Insecure => Err("its common name is empty".into()),
        c => Ok(c),
    }
}

/// The DNS names among a certificate's subject alternative names.
fn dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = c.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}

fn days(n: u32) -> Duration {
    Duration::from_secs(u64::from(n) * 86_400)
}

fn write_private(path: &Path, data: &str) -> Result<(), TlsError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    o.mode(0o600);
    o.open(path)
        .and_then(|mut f| f.write_all(data.as_bytes()))
        .map_err(|e| err(format!("{}: {e}", path.display())))
}

fn write_public(path: &Path, data: &str) -> Result<(), TlsError> {
    std::fs::write(path, data).map_err(|e| err(format!("{}: {e}", path.display())))
}

fn new_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|e| err(format!("{}: {e}", dir.display())))?;
    for f in [CA_FILE, CERT_FILE, KEY_FILE, CA_KEY_FILE] {
        if dir.join(f).exists() {
            return Err(err(format!(
                "{} exists already: credentials are never overwritten (remove it first)",
                dir.join(f).display()
            )));
        }
    }
    Ok(())
}

/// Makes a cluster authority in `dir`: `ca.pem` (give it to every node and user) and
/// `ca-key.pem` (keep it secret: whoever holds it can issue any identity).
pub fn init_ca(dir: &Path, cluster: &str) -> Result<(), TlsError> {
    new_dir(dir)?;
    let key = KeyPair::generate().map_err(|e| err(e.to_string()))?;
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("Tessera cluster authority {cluster}"),
    );
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = SystemTime::now();
    p.not_before = (now - Duration::from_secs(3600)).into();
    p.not_after = (now + days(CA_DAYS)).into();
    let cert = p.self_signed(&key).map_err(|e| err(e.to_string()))?;
    write_private(&dir.join(CA_KEY_FILE), &key.serialize_pem())?;
    write_public(&dir.join(CA_FILE), &cert.pem())
}

/// Issues the credentials of `caller` from the authority in `ca_dir` into `out`
/// (`ca.pem`, `cert.pem`, `key.pem`), valid for `valid_days` from now.
pub fn issue(ca_dir: &Path, caller: &Caller, valid_days: u32, out: &Path) -> Result<(), TlsError> {
    issue_between(ca_dir, caller, SystemTime::now(), days(valid_days), out)
}

/// As [`issue`], valid from `from` for `valid`: a test makes expired credentials.
pub fn issue_between(
    ca_dir: &Path,
    caller: &Caller,
    from: SystemTime,
    valid: Duration,
    out: &Path,
) -> Result<(), TlsError> {
    let role = caller
        .role()
        .ok_or_else(|| err("credentials name somebody: a role and a name"))?;
    let ca_pem = String::from_utf8(read(&ca_dir.join(CA_FILE))?)
        .map_err(|_| err(format!("{}: not text", ca_dir.join(CA_FILE).display())))?;
    let ca_key_pem = String::from_utf8(read(&ca_dir.join(CA_KEY_FILE))?)
        .map_err(|_| err(format!("{}: not text", ca_dir.join(CA_KEY_FILE).display())))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .map_err(|e| err(format!("{}: {e}", ca_dir.join(CA_KEY_FILE).display())))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .map_err(|e| err(format!("{}: {e}", ca_dir.join(CA_FILE).display())))?;
    new_dir(out)?;
    // Servers are dialled and must prove which kind they are; users only call.
    let names = serves_as(caller)
        .map(|s| vec![server_name(s).to_string()])
        .unwrap_or_default();
    let mut p = CertificateParams::new(names).map_err(|e| err(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, caller.label());
    p.distinguished_name = dn;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = match role {
        Role::Master | Role::Chunkserver => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Role::Client | Role::Admin => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    p.not_before = from.into();
    p.not_after = (from + valid).into();
    let key = KeyPair::generate().map_err(|e| err(e.to_string()))?;
    let cert = p.signed_by(&key, &issuer).map_err(|e| err(e.to_string()))?;
    write_private(&out.join(KEY_FILE), &key.serialize_pem())?;
    write_public(&out.join(CERT_FILE), &cert.pem())?;
    write_public(&out.join(CA_FILE), &ca_pem)
}

/// How a command's connections are secured: the credentials in `--certs` (or
/// `TESSERA_CERTS`), or none at all with `--insecure`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Security {
    /// Credentials directory: ca.pem (the cluster's authority), cert.pem and key.pem
    /// (this node's or user's), as `tessera admin certs issue` makes them. File and
    /// admin commands given none use ~/.config/tessera/certs (where `tessera dev` puts
    /// an admin's); servers must be given theirs.
    #[arg(long, env = "TESSERA_CERTS", value_name = "DIR", global = true)]
    pub certs: Option<PathBuf>,
    /// No authentication at all: connections are plain TCP, and anyone who reaches a
    /// port may do anything (read, change or delete any file, order chunkservers about).
    /// Only for a cluster on a network nobody else can reach.
    #[arg(
        long,
        env = "TESSERA_INSECURE",
        global = true,
        conflicts_with = "certs"
    )]
    pub insecure: bool,
}

/// Where file and admin commands look for credentials when given none.
pub fn default_user_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("tessera").join("certs"))
}

impl Security {
    /// A server's credentials, which must name what `want` accepts (`role`, in words);
    /// None with `--insecure`, said loudly. A server given neither refuses to start.
    pub fn server(
        &self,
        role: &str,
        want: impl Fn(&Caller) -> bool,
    ) -> Result<Option<Credentials>, String> {
        if self.insecure {
            tracing::warn!(
                "INSECURE: {role} runs with --insecure: no connection is authenticated, and \
                 anyone who reaches its port may read, change or delete any data"
            );
            return Ok(None);
        }
        let dir = self.certs.as_ref().ok_or_else(|| {
            format!(
                "no credentials: give the {role} --certs DIR (or TESSERA_CERTS), made by \
                 `tessera admin certs issue`, or --insecure to run with no authentication"
            )
        })?;
        let c = Credentials::load(dir).map_err(|e| e.to_string())?;
        if !want(&c.caller) {
            return Err(format!(
                "{}: the certificate names {}, not the {role}",
                dir.display(),
                c.caller
            ));
        }
        tracing::info!(identity = %c.caller, certs = %dir.display(), "mutual TLS");
        Ok(Some(c))
    }

    /// A user's credentials (a client's or an admin's): `--certs`, else the default
    /// directory; None with `--insecure`.
    pub fn user(&self) -> Result<Option<Credentials>, String> {
        if self.insecure {
            return Ok(None);
        }
        let dir = match &self.certs {
            Some(d) => d.clone(),
            None => match default_user_dir() {
                Some(d) if d.join(CERT_FILE).exists() => d,
                d => {
                    return Err(format!(
                        "no credentials: give --certs DIR (or TESSERA_CERTS), made by \
                         `tessera admin certs issue --role client`{}, or --insecure for a \
                         cluster that runs without authentication",
                        d.map(|d| format!(", or put them in {}", d.display()))
                            .unwrap_or_default()
                    ));
                }
            },
        };
        let c = Credentials::load(&dir).map_err(|e| e.to_string())?;
        match c.caller.role() {
            Some(Role::Client | Role::Admin) => Ok(Some(c)),
            _ => Err(format!(
                "{}: the certificate names {}, a server: file and admin commands take a \
                 client's or an admin's",
                dir.display(),
                c.caller
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller that prefers AES-256-GCM, as tonic's rustls does by default, is served
    /// AES-128-GCM: the server's order holds.
    #[test]
    fn a_server_picks_aes_128_gcm_whatever_its_caller_prefers() {
        let d = tempfile::tempdir().unwrap();
        let ca = d.path().join("ca");
        init_ca(&ca, "test").unwrap();
        let server = Caller::Master { replica: 1 };
        let user = Caller::Client {
            user: "alice".into(),
            groups: vec![],
        };
        issue(&ca, &server, 30, &d.path().join("m")).unwrap();
        issue(&ca, &user, 30, &d.path().join("u")).unwrap();
        let (s, u) = (
            Credentials::load(&d.path().join("m")).unwrap(),
            Credentials::load(&d.path().join("u")).unwrap(),
        );
        let default = rustls::crypto::ring::default_provider();
        assert_eq!(
            default.cipher_suites[0].suite(),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
            "ring's default no longer prefers AES-256: this test proves nothing"
        );
        let mut roots = rustls::RootCertStore::empty();
        roots.add(u.ca[0].clone()).unwrap();
        let key = PrivateKeyDer::from_pem_slice(&u.key_pem).unwrap();
        let client_cfg = rustls::ClientConfig::builder_with_provider(Arc::new(default))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(u.chain.clone(), key)
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from(server_name(ServerRole::Master)).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(client_cfg), name).unwrap();
        let mut served = rustls::ServerConnection::new(s.server_config().unwrap()).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut wire).unwrap();
            }
            served.read_tls(&mut &wire[..]).unwrap();
            served.process_new_packets().unwrap();
            let mut back = Vec::new();
            while served.wants_write() {
                served.write_tls(&mut back).unwrap();
            }
            client.read_tls(&mut &back[..]).unwrap();
            client.process_new_packets().unwrap();
            if !client.is_handshaking() && !served.is_handshaking() {
                break;
            }
        }
        assert!(!served.is_handshaking(), "the handshake did not finish");
        assert_eq!(
            served.negotiated_cipher_suite().map(|c| c.suite()),
            Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
        );
    }

    #[test]
    fn issued_credentials_load_and_name_their_holder() {
        let d = tempfile::tempdir().unwrap();
        let ca = d.path().join("ca");
        init_ca(&ca, "test").unwrap();
        let who = Caller::Client {
            user: "alice".into(),
            groups: vec!["staff".into()],
        };
        issue(&ca, &who, 30, &d.path().join("alice")).unwrap();
        let c = Credentials::load(&d.path().join("alice")).unwrap();
        assert_eq!(c.caller, who);
        c.server_config().unwrap();
        // Never overwritten.
        assert!(issue(&ca, &who, 30, &d.path().join("alice")).is_err());
        assert!(init_ca(&ca, "again").is_err());
        // Another cluster's certificate beside this authority is refused at load.
        let other = d.path().join("other");
        init_ca(&other, "other").unwrap();
        issue(&other, &who, 30, &d.path().join("mixed")).unwrap();
        std::fs::copy(ca.join(CA_FILE), d.path().join("mixed").join(CA_FILE)).unwrap();
        let e = Credentials::load(&d.path().join("mixed")).unwrap_err();
        assert!(e.to_string().contains("not valid under"), "{e}");
        // And so is an expired one.
        let old = SystemTime::now() - days(10);
        issue_between(&ca, &who, old, days(1), &d.path().join("old")).unwrap();
        let e = Credentials::load(&d.path().join("old")).unwrap_err();
        assert!(e.to_string().contains("xpired"), "{e}");
    }
}
