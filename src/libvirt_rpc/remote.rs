//! The part of libvirt's remote program (`src/remote/remote_protocol.x`: program
//! `0x20008086`, version 1) a peer-to-peer migration target serves: procedure numbers, the
//! argument and return structs of those procedures, typed parameters, `remote_error`.
//! Numbers, layouts and limits are the protocol's; the code is ours.

use super::xdr::{Decoder, Encoder, XdrError};

/// `REMOTE_PROGRAM`.
pub const REMOTE_PROGRAM: u32 = 0x2000_8086;
/// `REMOTE_PROTOCOL_VERSION`.
pub const REMOTE_PROTOCOL_VERSION: u32 = 1;
/// `KEEPALIVE_PROGRAM` (`src/rpc/virkeepaliveprotocol.x`, "keep").
pub const KEEPALIVE_PROGRAM: u32 = 0x6b65_6570;
/// `KEEPALIVE_PROTOCOL_VERSION`.
pub const KEEPALIVE_PROTOCOL_VERSION: u32 = 1;
/// `KEEPALIVE_PROC_PING`.
pub const KEEPALIVE_PROC_PING: i32 = 1;
/// `KEEPALIVE_PROC_PONG`.
pub const KEEPALIVE_PROC_PONG: i32 = 2;

/// `REMOTE_STRING_MAX`.
pub const STRING_MAX: usize = 4 << 20;
/// `REMOTE_MIGRATE_COOKIE_MAX`.
pub const MIGRATE_COOKIE_MAX: usize = 4 << 20;
/// `REMOTE_DOMAIN_MIGRATE_PARAM_LIST_MAX`.
pub const MIGRATE_PARAM_LIST_MAX: usize = 64;
/// `VIR_UUID_BUFLEN`.
pub const UUID_LEN: usize = 16;

/// Declares a fieldless enum whose discriminants are protocol numbers, with `from_number` made
/// from the same list, so each number is written once.
macro_rules! numbered {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $n:literal,)*
        }
        from_number: $from_doc:literal
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant = $n,)*
        }

        impl $name {
            #[doc = $from_doc]
            pub fn from_number(n: i32) -> Option<$name> {
                match n {
                    $($n => Some($name::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

numbered! {
    /// Procedures of the remote program this crate knows by name (`remote_procedure`).
    pub enum Procedure {
        /// `REMOTE_PROC_CONNECT_OPEN`.
        ConnectOpen = 1,
        /// `REMOTE_PROC_CONNECT_CLOSE`.
        ConnectClose = 2,
        /// `REMOTE_PROC_CONNECT_GET_TYPE`.
        ConnectGetType = 3,
        /// `REMOTE_PROC_CONNECT_GET_VERSION`.
        ConnectGetVersion = 4,
        /// `REMOTE_PROC_CONNECT_GET_HOSTNAME`.
        ConnectGetHostname = 59,
        /// `REMOTE_PROC_CONNECT_SUPPORTS_FEATURE`.
        ConnectSupportsFeature = 60,
        /// `REMOTE_PROC_AUTH_LIST`.
        AuthList = 66,
        /// `REMOTE_PROC_CONNECT_GET_LIB_VERSION`.
        ConnectGetLibVersion = 157,
        /// `REMOTE_PROC_DOMAIN_MIGRATE_PREPARE3`: the pre-params Prepare, which a source calls
        /// when the target does not claim `VIR_DRV_FEATURE_MIGRATION_PARAMS`; not served.
        DomainMigratePrepare3 = 214,
        /// `REMOTE_PROC_DOMAIN_MIGRATE_PREPARE3_PARAMS`.
        DomainMigratePrepare3Params = 303,
        /// `REMOTE_PROC_DOMAIN_MIGRATE_FINISH3_PARAMS`.
        DomainMigrateFinish3Params = 306,
    }
    from_number: "The procedure for a number, when it is one of ours."
}

numbered! {
    /// Driver features a client asks about with `CONNECT_SUPPORTS_FEATURE` (libvirt's
    /// `src/driver-features.h`, earlier `src/libvirt_internal.h`, `VIR_DRV_FEATURE_*`; the
    /// numbers are part of the protocol and never change).
    pub enum Feature {
        /// `VIR_DRV_FEATURE_MIGRATION_V1`.
        MigrationV1 = 1,
        /// `VIR_DRV_FEATURE_REMOTE`.
        Remote = 2,
        /// `VIR_DRV_FEATURE_MIGRATION_V2`.
        MigrationV2 = 3,
        /// `VIR_DRV_FEATURE_MIGRATION_P2P`.
        MigrationP2p = 4,
        /// `VIR_DRV_FEATURE_MIGRATION_DIRECT`.
        MigrationDirect = 5,
        /// `VIR_DRV_FEATURE_MIGRATION_V3`.
        MigrationV3 = 6,
        /// `VIR_DRV_FEATURE_MIGRATE_CHANGE_PROTECTION`.
        MigrateChangeProtection = 7,
        /// `VIR_DRV_FEATURE_FD_PASSING`.
        FdPassing = 8,
        /// `VIR_DRV_FEATURE_TYPED_PARAM_STRING`.
        TypedParamString = 9,
        /// `VIR_DRV_FEATURE_PROGRAM_KEEPALIVE`: answered by the RPC layer, not the driver; a
        /// "no" turns keepalive off on the client.
        ProgramKeepalive = 10,
        /// `VIR_DRV_FEATURE_XML_MIGRATABLE`.
        XmlMigratable = 11,
        /// `VIR_DRV_FEATURE_MIGRATION_OFFLINE`.
        MigrationOffline = 12,
        /// `VIR_DRV_FEATURE_MIGRATION_PARAMS`: without it a source falls back to the older
        /// `DOMAIN_MIGRATE_PREPARE3` (214), as libvirt 9.0 does here.
        MigrationParams = 13,
        /// `VIR_DRV_FEATURE_REMOTE_EVENT_CALLBACK`.
        RemoteEventCallback = 14,
        /// `VIR_DRV_FEATURE_REMOTE_CLOSE_CALLBACK`.
        RemoteCloseCallback = 15,
        /// `VIR_DRV_FEATURE_NETWORK_UPDATE_HAS_CORRECT_ORDER`.
        NetworkUpdateHasCorrectOrder = 16,
    }
    from_number: "The feature for a number, when libvirt defines it."
}

/// A typed parameter's value (`remote_typed_param_value`, discriminants `VIR_TYPED_PARAM_*`).
#[derive(Debug, Clone, PartialEq)]
pub enum TypedValue {
    /// `VIR_TYPED_PARAM_INT`.
    Int(i32),
    /// `VIR_TYPED_PARAM_UINT`.
    UInt(u32),
    /// `VIR_TYPED_PARAM_LLONG`.
    LLong(i64),
    /// `VIR_TYPED_PARAM_ULLONG`.
    ULLong(u64),
    /// `VIR_TYPED_PARAM_DOUBLE`.
    Double(f64),
    /// `VIR_TYPED_PARAM_BOOLEAN`.
    Boolean(bool),
    /// `VIR_TYPED_PARAM_STRING`.
    String(String),
}

/// `remote_typed_param`: a named value (`VIR_MIGRATE_PARAM_*` for migration).
#[derive(Debug, Clone, PartialEq)]
pub struct TypedParam {
    /// The parameter's name (`destination_xml`, `migrate_uri`, ...).
    pub field: String,
    /// Its value.
    pub value: TypedValue,
}

impl TypedParam {
    fn decode(d: &mut Decoder<'_>) -> Result<TypedParam, XdrError> {
        // VIR_TYPED_PARAM_FIELD_LENGTH is 80; the wire type is a plain string.
        let field = d.string("typed parameter name", 80)?;
        let value = match d.i32()? {
            1 => TypedValue::Int(d.i32()?),
            2 => TypedValue::UInt(d.u32()?),
            3 => TypedValue::LLong(d.i64()?),
            4 => TypedValue::ULLong(d.u64()?),
            5 => TypedValue::Double(d.f64()?),
            6 => TypedValue::Boolean(d.i32()? != 0),
            7 => TypedValue::String(d.string("typed parameter string", STRING_MAX)?),
            value => {
                return Err(XdrError::BadDiscriminant {
                    what: "remote_typed_param_value",
                    value,
                })
            }
        };
        Ok(TypedParam { field, value })
    }

    fn encode(&self, e: &mut Encoder) {
        e.string(&self.field);
        match &self.value {
            TypedValue::Int(v) => e.i32(1).i32(*v),
            TypedValue::UInt(v) => e.i32(2).u32(*v),
            TypedValue::LLong(v) => e.i32(3).i64(*v),
            TypedValue::ULLong(v) => e.i32(4).u64(*v),
            TypedValue::Double(v) => e.i32(5).f64(*v),
            TypedValue::Boolean(v) => e.i32(6).i32(*v as i32),
            TypedValue::String(v) => e.i32(7).string(v),
        };
    }

    /// A string parameter.
    pub fn string(field: &str, value: impl Into<String>) -> TypedParam {
        TypedParam {
            field: field.to_owned(),
            value: TypedValue::String(value.into()),
        }
    }
}

/// The string value of parameter `name` (the first one: libvirt allows repeated ones for
/// lists such as `migrate_disks`).
pub fn param_string<'a>(params: &'a [TypedParam], name: &str) -> Option<&'a str> {
    params.iter().find_map(|p| match &p.value {
        TypedValue::String(s) if p.field == name => Some(s.as_str()),
        _ => None,
    })
}

/// Every string value of parameter `name`, in order.
pub fn param_strings<'a>(params: &'a [TypedParam], name: &str) -> Vec<&'a str> {
    params
        .iter()
        .filter_map(|p| match &p.value {
            TypedValue::String(s) if p.field == name => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

/// `remote_open_args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenArgs {
    /// The URI the client opens on the server (`qemu:///system`), if any.
    pub name: Option<String>,
    /// `virConnectFlags`.
    pub flags: u32,
}

impl OpenArgs {
    /// Decodes the body of a `CONNECT_OPEN` call.
    pub fn decode(body: &[u8]) -> Result<OpenArgs, XdrError> {
        let mut d = Decoder::new(body);
        let name = d.optional(|d| d.string("connection URI", STRING_MAX))?;
        let flags = d.u32()?;
        d.finish()?;
        Ok(OpenArgs { name, flags })
    }

    /// Encodes the body of a `CONNECT_OPEN` call (the client's side).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.optional_string(self.name.as_deref()).u32(self.flags);
        e.into_bytes()
    }
}

/// `remote_supports_feature_args`: the feature number.
pub fn decode_supports_feature(body: &[u8]) -> Result<i32, XdrError> {
    let mut d = Decoder::new(body);
    let f = d.i32()?;
    d.finish()?;
    Ok(f)
}

/// `remote_domain_migrate_prepare3_params_args`.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepare3ParamsArgs {
    /// `VIR_MIGRATE_PARAM_*` parameters (domain XML, URI, bandwidth...).
    pub params: Vec<TypedParam>,
    /// The source's migration cookie (libvirt's `<qemu-migration>` XML, NUL-terminated).
    pub cookie: Vec<u8>,
    /// `virDomainMigrateFlags`.
    pub flags: u32,
}

impl Prepare3ParamsArgs {
    /// Decodes the body of a `DOMAIN_MIGRATE_PREPARE3_PARAMS` call.
    pub fn decode(body: &[u8]) -> Result<Prepare3ParamsArgs, XdrError> {
        let mut d = Decoder::new(body);
        let params = d.array(
            "migration parameters",
            MIGRATE_PARAM_LIST_MAX,
            TypedParam::decode,
        )?;
        let cookie = d.opaque("migration cookie", MIGRATE_COOKIE_MAX)?;
        let flags = d.u32()?;
        d.finish()?;
        Ok(Prepare3ParamsArgs {
            params,
            cookie,
            flags,
        })
    }

    /// Encodes the body of a `DOMAIN_MIGRATE_PREPARE3_PARAMS` call (the source's side).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(self.params.len() as u32);
        for p in &self.params {
            p.encode(&mut e);
        }
        e.opaque(&self.cookie).u32(self.flags);
        e.into_bytes()
    }
}

/// `remote_domain_migrate_prepare3_params_ret`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare3ParamsRet {
    /// The target's cookie.
    pub cookie: Vec<u8>,
    /// The URI the source's QEMU sends its stream to (none: the source uses its own).
    pub uri: Option<String>,
}

impl Prepare3ParamsRet {
    /// Encodes the reply body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.opaque(&self.cookie).optional_string(self.uri.as_deref());
        e.into_bytes()
    }

    /// Decodes the reply body (the source's side): the cookie and the URI are bounded by the
    /// protocol's limits.
    pub fn decode(body: &[u8]) -> Result<Prepare3ParamsRet, XdrError> {
        let mut d = Decoder::new(body);
        let cookie = d.opaque("migration cookie", MIGRATE_COOKIE_MAX)?;
        let uri = d.optional(|d| d.string("migration URI", STRING_MAX))?;
        d.finish()?;
        Ok(Prepare3ParamsRet { cookie, uri })
    }
}

/// `remote_domain_migrate_finish3_params_args`.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish3ParamsArgs {
    /// The same parameters as Prepare's (domain name, URI).
    pub params: Vec<TypedParam>,
    /// The source's cookie after Perform.
    pub cookie: Vec<u8>,
    /// `virDomainMigrateFlags`.
    pub flags: u32,
    /// Non-zero when the source's Perform failed: the target discards its domain.
    pub cancelled: bool,
}

impl Finish3ParamsArgs {
    /// Decodes the body of a `DOMAIN_MIGRATE_FINISH3_PARAMS` call.
    pub fn decode(body: &[u8]) -> Result<Finish3ParamsArgs, XdrError> {
        let mut d = Decoder::new(body);
        let params = d.array(
            "migration parameters",
            MIGRATE_PARAM_LIST_MAX,
            TypedParam::decode,
        )?;
        let cookie = d.opaque("migration cookie", MIGRATE_COOKIE_MAX)?;
        let flags = d.u32()?;
        let cancelled = d.i32()? != 0;
        d.finish()?;
        Ok(Finish3ParamsArgs {
            params,
            cookie,
            flags,
            cancelled,
        })
    }

    /// Encodes the body of a `DOMAIN_MIGRATE_FINISH3_PARAMS` call (the source's side).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(self.params.len() as u32);
        for p in &self.params {
            p.encode(&mut e);
        }
        e.opaque(&self.cookie)
            .u32(self.flags)
            .i32(self.cancelled as i32);
        e.into_bytes()
    }
}

/// `remote_nonnull_domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// Domain name.
    pub name: String,
    /// Domain UUID.
    pub uuid: [u8; UUID_LEN],
    /// Domain id (-1 when inactive).
    pub id: i32,
}

impl Domain {
    fn encode(&self, e: &mut Encoder) {
        e.string(&self.name).fixed_opaque(&self.uuid).i32(self.id);
    }

    fn decode(d: &mut Decoder<'_>) -> Result<Domain, XdrError> {
        // REMOTE_STRING_MAX bounds a domain name on the wire.
        let name = d.string("domain name", STRING_MAX)?;
        let mut uuid = [0u8; UUID_LEN];
        uuid.copy_from_slice(d.fixed_opaque(UUID_LEN)?);
        let id = d.i32()?;
        Ok(Domain { name, uuid, id })
    }
}

/// `remote_domain_migrate_finish3_params_ret`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish3ParamsRet {
    /// The domain now running on the target.
    pub domain: Domain,
    /// The target's cookie.
    pub cookie: Vec<u8>,
}

impl Finish3ParamsRet {
    /// Encodes the reply body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        self.domain.encode(&mut e);
        e.opaque(&self.cookie);
        e.into_bytes()
    }

    /// Decodes the reply body (the source's side).
    pub fn decode(body: &[u8]) -> Result<Finish3ParamsRet, XdrError> {
        let mut d = Decoder::new(body);
        let domain = Domain::decode(&mut d)?;
        let cookie = d.opaque("migration cookie", MIGRATE_COOKIE_MAX)?;
        d.finish()?;
        Ok(Finish3ParamsRet { domain, cookie })
    }
}

/// The `virErrorNumber` codes this server answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// `VIR_ERR_INTERNAL_ERROR`.
    Internal = 1,
    /// `VIR_ERR_NO_SUPPORT`.
    NoSupport = 3,
    /// `VIR_ERR_OPERATION_FAILED`.
    OperationFailed = 9,
    /// `VIR_ERR_RPC`.
    Rpc = 39,
    /// `VIR_ERR_OPERATION_INVALID`.
    OperationInvalid = 55,
    /// `VIR_ERR_CONFIG_UNSUPPORTED`.
    ConfigUnsupported = 67,
}

/// `VIR_FROM_QEMU`.
pub const FROM_QEMU: i32 = 10;
/// `VIR_FROM_RPC`.
pub const FROM_RPC: i32 = 7;
/// `VIR_ERR_ERROR`.
const LEVEL_ERROR: i32 = 2;

/// `remote_error`: what a failed call's reply carries. The source's libvirt shows `message`
/// as the migration's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    /// `virErrorNumber`.
    pub code: ErrorCode,
    /// `virErrorDomain`.
    pub domain: i32,
    /// The message.
    pub message: String,
}

impl RemoteError {
    /// An error of the QEMU driver's domain.
    pub fn qemu(code: ErrorCode, message: impl Into<String>) -> RemoteError {
        RemoteError {
            code,
            domain: FROM_QEMU,
            message: message.into(),
        }
    }

    /// Encodes the reply body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.i32(self.code as i32)
            .i32(self.domain)
            .optional_string(Some(&self.message))
            .i32(LEVEL_ERROR)
            .bool(false) // dom
            .optional_string(None)
            .optional_string(None)
            .optional_string(None)
            .i32(0)
            .i32(0)
            .bool(false); // net
        e.into_bytes()
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RemoteError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_args_decode() {
        let mut e = Encoder::new();
        e.u32(2)
            .string("destination_xml")
            .i32(7)
            .string("<domain/>")
            .string("bandwidth")
            .i32(4)
            .u64(5);
        e.opaque(b"<qemu-migration/>\0").u32(0x13);
        let a = Prepare3ParamsArgs::decode(&e.into_bytes()).unwrap();
        assert_eq!(
            param_string(&a.params, "destination_xml"),
            Some("<domain/>")
        );
        assert_eq!(a.params[1].value, TypedValue::ULLong(5));
        assert_eq!(a.flags, 0x13);
    }
}
