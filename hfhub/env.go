package hfhub

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// DefaultEndpoint is the Hub huggingface_hub talks to when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Env is the Hub configuration huggingface_hub reads from the environment (its constants.py and
// utils/_auth.py), read the same way so that memfit and Python share one cache, one token and one mirror.
type Env struct {
	// Endpoint is HF_ENDPOINT (a mirror or a private Hub), else https://huggingface.co; no trailing slash.
	Endpoint string
	// Cache is the hub cache folder: HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
	// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
	Cache string
	// Token is HF_TOKEN, else HUGGING_FACE_HUB_TOKEN, else the file HF_TOKEN_PATH, else HF_HOME/token (what
	// `huggingface-cli login` writes); "" for none. TokenFrom says which, for messages.
	Token, TokenFrom string
	// Offline is HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to 1, ON, YES or TRUE: the cache only, no request.
	Offline bool
}

// FromEnv reads the Hub configuration from the process environment.
func FromEnv() Env {
	home := expand(os.Getenv("HF_HOME"))
	if home == "" {
		xdg := os.Getenv("XDG_CACHE_HOME")
		if xdg == "" {
			xdg = filepath.Join(userHome(), ".cache")
		}
		home = filepath.Join(expand(xdg), "huggingface")
	}
	cache := expand(os.Getenv("HF_HUB_CACHE"))
	if cache == "" {
		cache = expand(os.Getenv("HUGGINGFACE_HUB_CACHE"))
	}
	if cache == "" {
		cache = filepath.Join(home, "hub")
	}
	e := Env{Endpoint: strings.TrimRight(os.Getenv("HF_ENDPOINT"), "/"), Cache: cache,
		Offline: isTrue(os.Getenv("HF_HUB_OFFLINE")) || isTrue(os.Getenv("TRANSFORMERS_OFFLINE"))}
	if e.Endpoint == "" {
		e.Endpoint = DefaultEndpoint
	}
	for _, name := range []string{"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"} {
		if t := cleanToken(os.Getenv(name)); t != "" {
			e.Token, e.TokenFrom = t, name
			return e
		}
	}
	path := expand(os.Getenv("HF_TOKEN_PATH"))
	if path == "" {
		path = filepath.Join(home, "token")
	}
	if data, err := readfile.Read(path, 1<<16); err == nil {
		if t := cleanToken(string(data)); t != "" {
			e.Token, e.TokenFrom = t, path
		}
	}
	return e
}

// isTrue is huggingface_hub's _is_true: ENV_VARS_TRUE_VALUES, case-insensitively.
func isTrue(v string) bool {
	switch strings.ToUpper(v) {
	case "1", "ON", "YES", "TRUE":
		return true
	}
	return false
}

// cleanToken is huggingface_hub's _clean_token: line breaks removed, spaces trimmed.
func cleanToken(s string) string {
	return strings.TrimSpace(strings.NewReplacer("\r", "", "\n", "").Replace(s))
}

// expand is Python's os.path.expanduser(os.path.expandvars(p)), as huggingface_hub applies to its paths.
func expand(p string) string {
	if p == "" {
		return ""
	}
	p = os.ExpandEnv(p)
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = filepath.Join(userHome(), p[1:])
	}
	return p
}

func userHome() string {
	if h, err := os.UserHomeDir(); err == nil {
		return h
	}
	return "."
}
