"""What a replacement machine runs at boot: the bootstrap script (adopt the lost jobs from the
mirror, make the daemon start at every boot, start it) and how it joins a launch template's own
user data. Pure text: no cloud client here, so it is tested without one."""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import gzip
import re
import shlex
from email.message import Message
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Optional

from ..contract import ENV_CONFIG, ENV_HOME, is_job_uid
from ..model.markets import MARKETS
from ..home.paths import BOOT_ENV
from .provider import LaunchRequest, RelaunchError

USER_DATA_LIMIT = 16 * 1024  # EC2 refuses user data over 16 KB (before base64)
BOOTSTRAP_MARK = "# --- orch recovery bootstrap"
BOOTSTRAP_PART = "orch-recovery-bootstrap.sh"  # the part's file name in a MIME multipart user data

# cloud-init picks a part's handler by its content type; a script's first line says which it is.
_STARTS = (
    ("#!", "x-shellscript"),
    ("#cloud-config", "cloud-config"),
    ("#include", "x-include-url"),
    ("#cloud-boothook", "cloud-boothook"),
    ("#part-handler", "part-handler"),
    ("## template: jinja", "jinja2"),
)


def check_request(request: LaunchRequest, provider: str) -> None:
    """The request's values go into a shell script and instance tags: refuse anything odd."""
    if request.market not in MARKETS:
        raise RelaunchError(f"{provider} provider: market must be 'spot' or 'on-demand' (got {request.market!r})")
    bad = [uid for uid in request.job_uids if not is_job_uid(uid)]
    if not request.job_uids or bad:
        raise RelaunchError(f"{provider} provider: job uids must be 1-64 letters, digits, _ or - (got {bad or 'none'})")
    if not request.url or any(ord(c) < 32 or ord(c) == 127 or c in '"\\' for c in request.url):
        raise RelaunchError(f"{provider} provider: the mirror URL is empty or has quotes or control characters")


def bootstrap_script(
    request: LaunchRequest, *, preemption_source: Optional[str] = None, instance_credentials: bool = False
) -> str:
    """The shell script a new machine runs as root at its first boot. It expects orch installed (by
    the image or the launch template's own user data): on PATH, or at /opt/orch/bin/orch. A machine
    without a config.toml gets one naming the mirror; `instance_credentials`: the bucket is reached
    with the machine's role (an EC2 instance profile), and `preemption_source`: the cloud's notice
    API (on EC2 the lease then records the instance id, so `orch watch` can ask whether it is gone)."""
    q = shlex.quote
    config = ["[storage]", f'url = "{request.url}"']
    if instance_credentials:
        config.append('credentials = "instance"')
    if request.signing_key_env and request.signing_key_env.isidentifier():
        # the variable's name; the key itself comes from the image (boot.env) or the cloud's secret store
        config.append(f'signing_key_env = "{request.signing_key_env}"')
    if preemption_source:
        config += ["", "[preemption]", f'sources = ["{preemption_source}"]']
    config_text = "\n".join(config) + "\n"
    jobs = " ".join(request.job_uids)
    return f"""#!/bin/bash
{BOOTSTRAP_MARK}: launch {request.launch_number} for job(s) {jobs} on the {request.market} market.
# Added by `orch watch`; the log is /var/log/orch-recovery.log.
export HOME="${{HOME:-/root}}"
export {ENV_HOME}="${{{ENV_HOME}:-$HOME/.orch}}"
export ORCH_RECOVERY_URL={q(request.url)}
export ORCH_RECOVERY_JOBS={q(jobs)}
export ORCH_RECOVERY_MARKET={q(request.market)}
export ORCH_RECOVERY_LAUNCH={int(request.launch_number)}
orch_recovery() {{
  local orch
  orch="$(command -v orch || true)"
  [ -n "$orch" ] || [ ! -x /opt/orch/bin/orch ] || orch=/opt/orch/bin/orch
  if [ -z "$orch" ]; then
    echo "orch recovery: orch is not installed (not on PATH, not /opt/orch/bin/orch): the image or the launch template must install it" >&2
    return 1
  fi
  mkdir -p -m 700 "${ENV_HOME}"
  local config="${{{ENV_CONFIG}:-${ENV_HOME}/config.toml}}"
  if [ ! -e "$config" ]; then
    printf '%s' {q(config_text)} > "$config"
  fi
  local env_file="${ENV_HOME}/{BOOT_ENV}"  # the secrets config.toml names with *_env, if the image has them
  if [ -f "$env_file" ]; then set -a; . "$env_file"; set +a; fi
  local uid
  for uid in $ORCH_RECOVERY_JOBS; do
    # A planned move's new machine boots while the old one still holds the lease: the refusal then
    # leaves a pending adoption: the daemon, run at the end of this script, completes it at the hand-over.
    "$orch" adopt "$ORCH_RECOVERY_URL" --job "$uid" --yes || echo "orch recovery: adopting job $uid failed" >&2
  done
  "$orch" daemon install || echo "orch recovery: the daemon will not start at boot" >&2
  "$orch" daemon start
}}
orch_recovery >> /var/log/orch-recovery.log 2>&1
"""


def with_bootstrap(user_data: bytes, script: str) -> bytes:
    """A launch template's user data with the bootstrap after it:
    - none: the bootstrap alone;
    - a shell script: the bootstrap appended (one script, one environment), unless the script has a
      top-level `exit`, which would end it before the bootstrap: then as two parts, below;
    - MIME multipart (cloud-init): the bootstrap added as one more shell-script part;
    - anything else cloud-init reads (#cloud-config, #include, ...): both as parts of a new multipart;
    - gzip: unpacked first. Output over EC2's 16 KB is refused."""
    if user_data[:2] == b"\x1f\x8b":
        try:
            user_data = gzip.decompress(user_data)
        except (OSError, EOFError) as exc:
            raise RelaunchError(f"the launch template's user data is gzip but does not unpack: {exc}") from None
    try:
        text = user_data.decode("utf-8")
    except UnicodeDecodeError:
        raise RelaunchError(
            "the launch template's user data is neither text nor gzip: orch cannot add its bootstrap to it "
            "(use a shell script, #cloud-config or MIME multipart user data)"
        ) from None
    if BOOTSTRAP_MARK in text:
        raise RelaunchError(
            "the launch template's user data already holds an orch recovery bootstrap: use a template of your own "
            "(not one saved from a recovered instance)"
        )
    if not text.strip():
        out = script
    elif _is_multipart(text):
        out = _add_part(text, script)
    elif text.startswith("#!") and not _top_level_exit(text):
        out = text.rstrip("\n") + "\n\n" + script.split("\n", 1)[1]  # without its own #! line
    else:
        out = _as_multipart(text, script)
    raw = out.encode()
    if len(raw) > USER_DATA_LIMIT:
        raise RelaunchError(
            f"the launch template's user data with orch's bootstrap is {len(raw)} bytes; EC2 takes at most "
            f"{USER_DATA_LIMIT}: shorten the template's user data (install orch in the image instead)"
        )
    return raw


def decode_user_data(value: Optional[str]) -> bytes:
    """A launch template's UserData field (base64; absent for none)."""
    if not value:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RelaunchError("the launch template's user data is not valid base64") from None


def _is_multipart(text: str) -> bool:
    head = text.lstrip()[:2000].lower()
    return head.startswith(("content-type: multipart", "mime-version:")) and "multipart/" in head


def _top_level_exit(text: str) -> bool:
    return any(re.match(r"exit\b", line) for line in text.splitlines())


def _content_type(text: str) -> str:
    for prefix, subtype in _STARTS:
        if text.startswith(prefix):
            return subtype
    return "plain"  # cloud-init guesses a text/plain part's type from its first line


def _bootstrap_part(script: str) -> MIMEText:
    part = MIMEText(script, "x-shellscript", "utf-8")
    part.add_header("Content-Disposition", "attachment", filename=BOOTSTRAP_PART)
    return part


def _as_multipart(text: str, script: str) -> str:
    outer = MIMEMultipart("mixed")
    first = MIMEText(text, _content_type(text), "utf-8")
    first.add_header("Content-Disposition", "attachment", filename="launch-template-user-data")
    outer.attach(first)
    outer.attach(_bootstrap_part(script))  # cloud-init runs shell parts in order, after the template's
    return outer.as_string()


def _add_part(text: str, script: str) -> str:
    msg: Message = email.message_from_string(text.lstrip(), policy=email.policy.compat32)
    if not msg.is_multipart():
        raise RelaunchError(
            "the launch template's user data looks like MIME multipart but does not parse as one: fix the template"
        )
    msg.attach(_bootstrap_part(script))
    return msg.as_string()
