//! `GetDomainDirtyRateStats`: the guest's dirty-page rate in MB/s (`manager.go`
//! `GetDomainDirtyRateInMiB`, `cli/libvirt.go`, v1.9.0).
//!
//! KubeVirt asks libvirt for a 1 s page-sampling measurement and answers with the result of the
//! *previous* call (its first call after start always fails). The fact sheet allows the fresh
//! value, which this returns: `calc-dirty-rate {calc-time: 1, mode: page-sampling}`, 1 s sleep,
//! then `query-dirty-rate` every 200 ms until `measured`. Results are cached for 3 s, as
//! KubeVirt's `TimeDefinedCache`; concurrent callers share one measurement.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::CmdApiError;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{CalcDirtyRate, QueryDirtyRate};

/// Measurement length (KubeVirt `dirtyRateCalculationTime`, 1 s).
pub const CALC_TIME: Duration = Duration::from_secs(1);
/// How long a result is served again (KubeVirt: 3 s).
pub const CACHE_TTL: Duration = Duration::from_secs(3);
/// Poll interval of `query-dirty-rate` after the measurement (KubeVirt: 200 ms).
pub const POLL: Duration = Duration::from_millis(200);
/// How long after the measurement the result may take to show.
pub const RESULT_WAIT: Duration = Duration::from_secs(2);
/// Timeout of each QMP command.
const QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// The dirty-rate cache of one domain.
#[derive(Debug, Default)]
pub struct DirtyRate {
    last: Mutex<Option<(Instant, i64)>>,
}

impl DirtyRate {
    /// The dirty rate in MB/s (cached for [`CACHE_TTL`]).
    ///
    /// # Errors
    /// [`CmdApiError::Qmp`] for a refused command, [`CmdApiError::Refused`] when no measurement
    /// completed (KubeVirt's texts).
    pub async fn get(&self, client: &QmpClient) -> Result<i64, CmdApiError> {
        let mut last = self.last.lock().await;
        if let Some((at, rate)) = *last {
            if at.elapsed() < CACHE_TTL {
                return Ok(rate);
            }
        }
        let rate = measure(client).await?;
        *last = Some((Instant::now(), rate));
        Ok(rate)
    }
}

async fn measure(client: &QmpClient) -> Result<i64, CmdApiError> {
    let calc = CalcDirtyRate {
        calc_time: CALC_TIME.as_secs() as i64,
        mode: Some("page-sampling".into()),
    };
    client.run_timeout(&calc, QMP_TIMEOUT).await?;
    tokio::time::sleep(CALC_TIME).await;
    let deadline = Instant::now() + RESULT_WAIT;
    loop {
        let info = client.run_timeout(&QueryDirtyRate, QMP_TIMEOUT).await?;
        if info.status == "measured" {
            return info.dirty_rate.ok_or_else(|| {
                CmdApiError::Refused(
                    "failed to get domain dirty rate stats: Dirty rate MegabytesPerSecondSet is false"
                        .into(),
                )
            });
        }
        if Instant::now() >= deadline {
            return Err(CmdApiError::Refused(format!(
                "failed to get domain dirty rate stats: failed to get dirty rate stats: dirty calc status is {}",
                match info.status.as_str() {
                    "unstarted" => "DOMAIN_DIRTYRATE_UNSTARTED",
                    _ => "DOMAIN_DIRTYRATE_MEASURING",
                }
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}
