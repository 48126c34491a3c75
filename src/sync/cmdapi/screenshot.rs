//! `GetScreenshot`: QMP `screendump` of screen 0 as PNG into a temporary file, read and removed,
//! as libvirt's `virDomainScreenshot` does for KubeVirt (`manager.go` `GetScreenshot`, v1.9.0).
//! QEMU before 7.1 knows no `format` and writes PPM; then the PPM is returned with its MIME type,
//! as libvirt does.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::CmdApiError;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{Screendump, ScreendumpFormat};
use crate::qmp::QmpError;
use crate::sync::rpc::manager::Screenshot;

/// MIME type of a PNG screenshot.
pub const MIME_PNG: &str = "image/png";
/// MIME type of a PPM screenshot (QEMU < 7.1).
pub const MIME_PPM: &str = "image/x-portable-pixmap";

/// How long QEMU may take to write the image (virt-handler's deadline is 5 s).
pub const SCREENDUMP_TIMEOUT: Duration = Duration::from_secs(4);

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Takes a screenshot of screen 0; the temporary file goes to `dir` (a directory QEMU can write).
///
/// # Errors
/// [`CmdApiError::Qmp`] when QEMU refuses (no display: `no screens to take screenshot from` in
/// libvirt's words; QEMU names the missing console), [`CmdApiError::Io`] when the file cannot be
/// read.
pub async fn take(client: &QmpClient, dir: &Path) -> Result<Screenshot, CmdApiError> {
    let file = dir.join(format!(
        "screenshot-{}-{}.img",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let filename = file.to_string_lossy().into_owned();
    let png = Screendump {
        filename: filename.clone(),
        format: Some(ScreendumpFormat::Png),
    };
    let mime = match client.run_timeout(&png, SCREENDUMP_TIMEOUT).await {
        Ok(_) => MIME_PNG,
        Err(QmpError::Command { desc, .. }) if desc.contains("format") => {
            let ppm = Screendump {
                filename,
                format: None,
            };
            client.run_timeout(&ppm, SCREENDUMP_TIMEOUT).await?;
            MIME_PPM
        }
        Err(e) => return Err(e.into()),
    };
    let data = tokio::fs::read(&file).await;
    let _ = tokio::fs::remove_file(&file).await;
    let data = data.map_err(|source| CmdApiError::Io {
        what: format!("cannot read the screenshot {}", file.display()),
        source,
    })?;
    Ok(Screenshot {
        mime: mime.to_string(),
        data,
    })
}
