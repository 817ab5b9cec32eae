"""What `orch doctor` reports: one finding (area, level, text, the command that fixes it) and the
one-screen text of all of them."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, BAD = "ok", "warn", "problem"


@dataclass
class Finding:
    area: str
    level: str
    text: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"area": self.area, "level": self.level, "text": self.text, "fix": self.fix}


def render(findings: list[Finding]) -> str:
    mark = {OK: "ok  ", WARN: "warn", BAD: "FAIL"}
    lines = []
    for f in findings:
        lines.append(f"{mark[f.level]}  {f.area:<10} {f.text}")
        if f.fix and f.level != OK:
            lines.append(f"{'':16}fix: {f.fix}")
    problems = sum(1 for f in findings if f.level == BAD)
    warnings = sum(1 for f in findings if f.level == WARN)
    lines.append(
        "healthy" + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")
        if not problems
        else f"{problems} problem{'s' if problems != 1 else ''} found"
        + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")
    )
    return "\n".join(lines)
