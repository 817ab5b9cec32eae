# tests/look: the dashboard is driven in real headless Chromium (Debian's build; no download of
# a browser by a test tool). Without it those tests skip with a reason naming the package.
want chromium
