package hfhub

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFromEnv: the cache folder, endpoint, token and offline switch come from the variables huggingface_hub
// reads, with its precedence.
func TestFromEnv(t *testing.T) {
	home := t.TempDir()
	for _, k := range []string{"HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
		"HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("HOME", home)
	t.Setenv("XDG_CACHE_HOME", "")
	e := FromEnv()
	if e.Cache != filepath.Join(home, ".cache", "huggingface", "hub") || e.Endpoint != DefaultEndpoint || e.Token != "" || e.Offline {
		t.Errorf("defaults: %+v", e)
	}
	t.Setenv("XDG_CACHE_HOME", filepath.Join(home, "xdg"))
	if e := FromEnv(); e.Cache != filepath.Join(home, "xdg", "huggingface", "hub") {
		t.Errorf("XDG_CACHE_HOME: %s", e.Cache)
	}
	t.Setenv("HF_HOME", "~/hf")
	if err := os.MkdirAll(filepath.Join(home, "hf"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "hf", "token"), []byte("hf_from_login\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e = FromEnv()
	if e.Cache != filepath.Join(home, "hf", "hub") || e.Token != "hf_from_login" || e.TokenFrom != filepath.Join(home, "hf", "token") {
		t.Errorf("HF_HOME: %+v", e)
	}
	t.Setenv("HUGGINGFACE_HUB_CACHE", "/legacy")
	if e := FromEnv(); e.Cache != "/legacy" {
		t.Errorf("HUGGINGFACE_HUB_CACHE: %s", e.Cache)
	}
	t.Setenv("HF_HUB_CACHE", "$HOME/cache")
	t.Setenv("HF_TOKEN", " hf_env ")
	t.Setenv("HF_ENDPOINT", "https://hf-mirror.example/")
	t.Setenv("HF_HUB_OFFLINE", "yes")
	e = FromEnv()
	if e.Cache != filepath.Join(home, "cache") || e.Token != "hf_env" || e.TokenFrom != "HF_TOKEN" || e.Endpoint != "https://hf-mirror.example" || !e.Offline {
		t.Errorf("all set: %+v", e)
	}
	for v, want := range map[string]bool{"1": true, "ON": true, "true": true, "0": false, "no": false, "": false} {
		t.Setenv("HF_HUB_OFFLINE", v)
		if FromEnv().Offline != want {
			t.Errorf("HF_HUB_OFFLINE=%q: offline %v", v, !want)
		}
	}
	t.Setenv("HF_HUB_OFFLINE", "")
	t.Setenv("TRANSFORMERS_OFFLINE", "1")
	if !FromEnv().Offline {
		t.Error("TRANSFORMERS_OFFLINE=1 is not offline")
	}
}

// TestParse: model ids and dataset URLs as the Hub's tools spell them; local paths are not ids.
func TestParse(t *testing.T) {
	models := map[string]Repo{
		"Qwen/Qwen2.5-0.5B":                              {Kind: Model, ID: "Qwen/Qwen2.5-0.5B"},
		"meta-llama/Llama-3.2-1B@main":                   {Kind: Model, ID: "meta-llama/Llama-3.2-1B", Revision: "main"},
		"org/name@refs/pr/3":                             {Kind: Model, ID: "org/name", Revision: "refs/pr/3"},
		"org/name@refs%2Fpr%2F3":                         {Kind: Model, ID: "org/name", Revision: "refs/pr/3"},
		"hf://org/name@v1.0":                             {Kind: Model, ID: "org/name", Revision: "v1.0"},
		"hf://models/org/name":                           {Kind: Model, ID: "org/name"},
		"org/n@0123456789abcdef0123456789abcdef01234567": {Kind: Model, ID: "org/n", Revision: "0123456789abcdef0123456789abcdef01234567"},
	}
	for s, want := range models {
		r, ok, err := ParseModel(s)
		if !ok || err != nil || r != want {
			t.Errorf("ParseModel(%q) = %+v, %v, %v; want %+v", s, r, ok, err, want)
		}
	}
	for _, s := range []string{"./model", "/abs/model", "a/b/c", "llama-1b", "vit:tiny", "../x/y", "org/na--me", "org/name.git", "-org/name", "org/"} {
		if _, ok, err := ParseModel(s); ok || err != nil {
			t.Errorf("ParseModel(%q) is an id (%v)", s, err)
		}
	}
	for _, s := range []string{"hf://datasets/org/name", "hf://org/name/sub", "hf://x"} {
		if _, ok, err := ParseModel(s); ok || err == nil {
			t.Errorf("ParseModel(%q): no error", s)
		}
	}
	data := map[string]DataRef{
		"hf://datasets/tatsu-lab/alpaca":                         {Repo: Repo{Kind: Dataset, ID: "tatsu-lab/alpaca"}},
		"hf://datasets/stanfordnlp/imdb@main/plain_text":         {Repo: Repo{Kind: Dataset, ID: "stanfordnlp/imdb", Revision: "main"}, Path: "plain_text"},
		"hf://datasets/org/d@refs/convert/parquet/default/train": {Repo: Repo{Kind: Dataset, ID: "org/d", Revision: "refs/convert/parquet"}, Path: "default/train"},
		"hf://datasets/org/d/data/train-00000-of-00001.parquet":  {Repo: Repo{Kind: Dataset, ID: "org/d"}, Path: "data/train-00000-of-00001.parquet"},
		"hf://datasets/org/d@refs%2Fconvert%2Fparquet/default/":  {Repo: Repo{Kind: Dataset, ID: "org/d", Revision: "refs/convert/parquet"}, Path: "default"},
	}
	for s, want := range data {
		d, err := ParseData(s)
		if err != nil || d != want {
			t.Errorf("ParseData(%q) = %+v, %v; want %+v", s, d, err, want)
		}
	}
	for _, s := range []string{"hf://org/name", "hf://datasets/org", "hf://datasets/org/na--me", "hf://datasets/org/d/../x", "hf://datasets/org/d@"} {
		if _, err := ParseData(s); err == nil {
			t.Errorf("ParseData(%q): no error", s)
		}
	}
}
