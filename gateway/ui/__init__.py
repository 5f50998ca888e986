"""The status page's static files (index.html, app.js, style.css): package data, no build step."""
