package preference_test

import (
	"testing"

	"github.com/memfit/memfit/internal/gtest"
)

func TestMain(m *testing.M) { gtest.Main(m) }
